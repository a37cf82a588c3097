// ClairvoyantPolicy: Belady's rule at segment granularity, driven by the AccessPlan.
//
// A segment is worth as much as its soonest-needed chunk: score(segment) = min over its live
// chunks of NextUseDistance (kNever when none is planned). The victim is the segment with the
// largest score — its first needed chunk lies furthest in the future; segments holding only
// unplanned chunks (score kNever) go first, least recently used among them.
//
// Admission (Belady-style bypass). When the tier is full, a new chunk is stored only if the
// victim segment holds nothing the plan needs again (score kNever) and the new chunk itself is
// planned; otherwise it is served but not stored, so a scan of chunks needed late (or never)
// cannot flush chunks needed sooner. Why not also trade live data for data needed sooner:
// within one epoch of a full permutation every chunk is read once, so the hits of an epoch are
// bounded by what is cached when it starts — keeping a full cache untouched ("static") already
// reaches that bound, and evicting a segment of k live chunks to let in chunks that arrive one
// by one loses hits whenever fewer than k of them come before the epoch ends (measured:
// 0.49 vs 0.50 hit ratio on the epochs benchmark with segment-for-chunk swaps). Dead data,
// by contrast, is pure gain to replace — the case when a plan moves on to other chunks or
// another dataset. Space freed that way (and free space below the budget) takes any planned
// chunk (AdmitIntoFreedSpace).
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
  bool AdmitIntoFreedSpace(uint64_t fingerprint) override;

 private:
  const AccessPlan& plan_;

};

}  // namespace shardcache::cache
