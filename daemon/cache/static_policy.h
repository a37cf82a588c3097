// StaticPolicy: fill the cache once, then admit nothing new — no churn. For a dataset larger
// than the cache read once per epoch in random order this keeps a fixed fraction resident and
// hits it every epoch (CoorDL's "MinIO" policy), where LRU evicts chunks just before they are
// read again.
//
// Admission when full is always declined. Forced evictions (budget shrink, free-space floor,
// ENOSPC) take the least recently used segment.
#pragma once

#include "daemon/cache/eviction_policy.h"

namespace shardcache::cache {

class StaticPolicy final : public EvictionPolicy {
 public:
  const char* name() const override { return "static"; }
  std::optional<uint32_t> PickVictim(std::span<const SegmentSummary> segments,
                                     std::optional<uint64_t> incoming) override;
};

}  // namespace shardcache::cache
