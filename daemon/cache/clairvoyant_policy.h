// ClairvoyantPolicy: Belady's rule at segment granularity, driven by the AccessPlan.
//
// A segment is worth as much as its soonest-needed chunk: score(segment) = min over its live
// chunks of NextUseDistance (kNever when none is planned). The victim is the segment with the
// largest score — its first needed chunk lies furthest in the future; segments holding only
// unplanned chunks (score kNever) go first, least recently used among them.
//
// Admission (Belady-style bypass): a chunk that needs an eviction is admitted only when its own
// next use is sooner than the victim's score. A chunk needed later than everything cached (or
// never) is served but not stored, so a one-pass scan cannot flush chunks needed sooner.
// Storing into free space is always allowed.
//
// Cost: O(live chunks) plan lookups per eviction (one eviction per segment filled).
#pragma once

#include "daemon/cache/access_plan.h"
#include "daemon/cache/eviction_policy.h"

namespace shardcache::cache {

class ClairvoyantPolicy final : public EvictionPolicy {
 public:
  explicit ClairvoyantPolicy(const AccessPlan& plan) : plan_(plan) {}
  const char* name() const override { return "clairvoyant"; }
  std::optional<uint32_t> PickVictim(std::span<const SegmentSummary> segments,
                                     std::optional<uint64_t> incoming) override;

 private:
  const AccessPlan& plan_;
};

}  // namespace shardcache::cache
