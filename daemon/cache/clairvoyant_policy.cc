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
  if (incoming_next >= victim_score) return std::nullopt;  // bypass: not worth an eviction
  return victim;
}

}  // namespace shardcache::cache
