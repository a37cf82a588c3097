// LruPolicy: evicts the segment whose most recent read or write is oldest; admits everything.
// The right default when the working set is smaller than the cache. Thrashes when a dataset
// larger than the cache is read once per epoch in random order (see static_policy.h).
#pragma once

#include "daemon/cache/eviction_policy.h"

namespace shardcache::cache {

class LruPolicy final : public EvictionPolicy {
 public:
  const char* name() const override { return "lru"; }
  std::optional<uint32_t> PickVictim(std::span<const SegmentSummary> segments,
                                     std::optional<uint64_t> incoming) override;
};

// Segment with the smallest last_access_tick (lowest id on ties); nullopt when empty.
std::optional<uint32_t> LeastRecentlyUsed(std::span<const SegmentSummary> segments);

}  // namespace shardcache::cache
