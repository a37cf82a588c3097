// EvictionPolicy: which whole segment the NVMe tier gives up when it needs room, and whether a
// new chunk is worth storing at the price of an eviction (admission). One interface, one file
// per policy (lru_policy, static_policy, clairvoyant_policy), in the shape of CacheLib navy's
// EvictionPolicy.
//
// The store's SegmentManager (segment_manager.h) calls PickVictim in two situations:
//   - admission: `incoming` holds the fingerprint of the chunk that needs a new segment. The
//     policy returns the segment to evict, or nullopt to *decline*: the chunk is then served
//     but not stored (counted as admission_declined). Storing into free space never asks.
//   - forced: `incoming` is empty (budget shrunk, free-space floor, ENOSPC). The policy must
//     return a victim whenever `segments` holds one.
// Only sealed segments are offered; the segment being written is never a victim.
//
// Thread safety: called with the store's mutex held; policies keep no state of their own
// beyond what they were constructed with.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "daemon/cache/cache_options.h"

namespace shardcache::cache {

class AccessPlan;

struct SegmentSummary {
  uint32_t id = 0;
  uint64_t last_access_tick = 0;                     // store's logical clock, larger = later
  const std::vector<uint64_t>* fingerprints = nullptr;  // live chunks in the segment
};

class EvictionPolicy {
 public:
  virtual ~EvictionPolicy() = default;
  virtual const char* name() const = 0;
  virtual std::optional<uint32_t> PickVictim(std::span<const SegmentSummary> segments,
                                             std::optional<uint64_t> incoming) = 0;
  // Asked for each chunk that would fill space freed by an eviction while the tier is at its
  // budget (the open segment after an admission eviction). Default: admit.
  virtual bool AdmitIntoFreedSpace(uint64_t fingerprint) { return true; }
};

// `plan` is required for kClairvoyant (it must outlive the policy), ignored otherwise.
std::unique_ptr<EvictionPolicy> MakeEvictionPolicy(EvictionPolicyKind kind, const AccessPlan* plan);

}  // namespace shardcache::cache
