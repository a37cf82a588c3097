#include "daemon/cache/clairvoyant_policy.h"

#include <algorithm>

namespace shardcache::cache {

std::optional<uint32_t> ClairvoyantPolicy::PickVictim(std::span<const SegmentSummary> segments,
                                                      std::optional<uint64_t> incoming) {
  std::optional<uint32_t> victim;
  uint64_t victim_score = 0;
  uint64_t victim_tick = 0;
  for (const auto& s : segments) {
    uint64_t score = AccessPlan::kNever;
    if (s.fingerprints != nullptr) {
      for (uint64_t fp : *s.fingerprints) {
        score = std::min(score, plan_.NextUseDistance(fp));
        if (score == 0) break;
      }
    }
    const bool better = !victim || score > victim_score ||
                        (score == victim_score && s.last_access_tick < victim_tick);
    if (better) {
      victim = s.id;
      victim_score = score;
      victim_tick = s.last_access_tick;
    }
  }
  if (!victim || !incoming) return victim;
  const uint64_t incoming_next = plan_.NextUseDistance(*incoming);
  // Only a segment nothing in the plan needs again is given up for a new chunk (see header).
  if (victim_score != AccessPlan::kNever || incoming_next == AccessPlan::kNever) return std::nullopt;
  return victim;
}

bool ClairvoyantPolicy::AdmitIntoFreedSpace(uint64_t fingerprint) {
  // At the budget, only chunks the plan will read again are worth the space.
  return plan_.empty() || plan_.NextUseDistance(fingerprint) != AccessPlan::kNever;
}

}  // namespace shardcache::cache
