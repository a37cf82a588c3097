#include "daemon/cache/lru_policy.h"

namespace shardcache::cache {

std::optional<uint32_t> LeastRecentlyUsed(std::span<const SegmentSummary> segments) {
  std::optional<uint32_t> best;
  uint64_t best_tick = 0;
  for (const auto& s : segments) {
    if (!best || s.last_access_tick < best_tick) {
      best = s.id;
      best_tick = s.last_access_tick;
    }
  }
  return best;
}

std::optional<uint32_t> LruPolicy::PickVictim(std::span<const SegmentSummary> segments,
                                              std::optional<uint64_t> /*incoming*/) {
  return LeastRecentlyUsed(segments);
}

}  // namespace shardcache::cache
