#include "daemon/cache/static_policy.h"

#include "daemon/cache/lru_policy.h"

namespace shardcache::cache {

std::optional<uint32_t> StaticPolicy::PickVictim(std::span<const SegmentSummary> segments,
                                                 std::optional<uint64_t> incoming) {
  if (incoming) return std::nullopt;  // full: keep what we have
  return LeastRecentlyUsed(segments);
}

}  // namespace shardcache::cache
