// AccessPlan: the known future read order of chunks, the input of the clairvoyant eviction
// policy (and of its Belady-style admission). The epoch planner (daemon/plan) knows every
// rank's sample order for the coming epochs; it turns that into chunk order and hands it here.
//
// Positions. Each dataset version has its own logical clock of planned reads: position p is
// the p-th chunk read in the plan (0-based, counting repeats, across epochs if the planner
// gives several). The *next use* of a chunk is the smallest planned position of that chunk at
// or after the version's current position ("now"); its *distance* is next use − now. A chunk
// with no planned position at or after now has distance kNever.
//
// The clock moves two ways (whichever is further wins):
//   - Advance(version, position): the planner reports how far readers have consumed the plan.
//   - self-clocking: a demand read of a chunk (CachedSource calls OnDemandRead) moves now to
//     just past that read's planned position, when the chunk's next use lies within
//     `self_clock_window` positions of now (so a stray read cannot throw the clock far ahead).
//     Prefetch reads never move the clock.
//
// Memory: 16 bytes per planned read (a sorted vector of (fingerprint, position) per version):
// 3 epochs of 1,000,000 chunks = 48 MB. Lookups are a binary search.
//
// Thread safety: all methods are safe from any thread (one shared_mutex; readers share it).
// Lock order: NvmeStore::mu_ may be held when calling NextUseDistance, never the reverse.
#pragma once

#include <cstdint>
#include <limits>
#include <map>
#include <span>
#include <string_view>
#include <vector>

#include "common/mutex.h"
#include "daemon/source/chunk_key.h"

namespace shardcache::cache {

struct ChunkRef {
  uint32_t shard = 0;
  uint64_t chunk = 0;
};

class AccessPlan {
 public:
  static constexpr uint64_t kNever = std::numeric_limits<uint64_t>::max();

  // Replaces the plan of dataset `version`: order[i] is read at position base_position + i.
  // An empty order removes the version's plan. The clock is set to base_position unless it is
  // already further.
  void SetFutureAccessOrder(std::string_view version, uint64_t base_position,
                            std::span<const ChunkRef> order);
  void Advance(std::string_view version, uint64_t position);
  void OnDemandRead(const ChunkKey& key);
  void Clear();

  // Distance (in planned reads) from now to the chunk's next use, or kNever. When several
  // versions plan the same fingerprint, the nearest use wins.
  uint64_t NextUseDistance(uint64_t fingerprint) const;
  bool empty() const;
  uint64_t Now(std::string_view version) const;

  uint64_t self_clock_window = 1ull << 20;

 private:
  struct VersionPlan {
    std::vector<std::pair<uint64_t, uint64_t>> uses;  // (fingerprint, position), sorted
    uint64_t now = 0;
  };
  // First planned position of `fp` at or after `from` in `plan`, or kNever.
  static uint64_t NextPosition(const VersionPlan& plan, uint64_t fp, uint64_t from);

  mutable SharedMutex mu_;
  // Keyed by VersionId (high, low).
  std::map<std::pair<uint64_t, uint64_t>, VersionPlan> plans_ GUARDED_BY(mu_);
};

}  // namespace shardcache::cache
