// ChunkIndex: the NVMe tier's in-memory index — which chunk (by fingerprint, chunk_key.h) lies
// where (segment, offset, length), and which chunks live in each segment. It mirrors the durable
// entries of the RocksDB index (index_db.h) plus the ones written but not yet committed, and is
// what every lookup consults: reads never touch RocksDB. In the shape of CacheLib navy's Index.
//
// Each segment's list of live fingerprints is what eviction drops from the map (RemoveSegment)
// and what the eviction policy scores (SegmentSummary, eviction_policy.h). A chunk stored twice
// (refetched after a drop) is indexed once: the later copy wins. In-memory cost: one map node
// per chunk (~48 B) + 8 B in its segment's list.
//
// Thread safety: none of its own. NvmeStore's mutex is held around every call (the store and
// its writer hold it GUARDED_BY that mutex).
#pragma once

#include <cstdint>
#include <optional>
#include <unordered_map>
#include <vector>

namespace shardcache::cache {

// Where a chunk lies: `length` chunk bytes at `offset` of segment file `segment`.
struct Loc {
  uint32_t segment;
  uint32_t length;
  uint64_t offset;
  bool operator==(const Loc& o) const {
    return segment == o.segment && length == o.length && offset == o.offset;
  }
};
static_assert(sizeof(Loc) == 16);

class ChunkIndex {
 public:
  size_t size() const { return map_.size(); }
  // Sizes the map for `entries` chunks (before loading the index at start-up).
  void Reserve(size_t entries) { map_.reserve(entries); }

  bool Contains(uint64_t fp) const { return map_.count(fp) > 0; }
  std::optional<Loc> Find(uint64_t fp) const;

  // Indexes the chunk at `loc`; an entry it already had (elsewhere) is replaced and leaves its
  // segment's list. True when an entry was replaced.
  bool Put(uint64_t fp, const Loc& loc);
  // Removes the entry if it still points at `loc`; true when this call removed it (false when
  // it is gone already or was replaced by a later copy).
  bool Drop(uint64_t fp, const Loc& loc);
  // Removes every entry in segment `id` (an evicted segment) and the segment's list.
  void RemoveSegment(uint32_t id);

  // The live chunks of segment `id` (an empty list when it holds none). The pointer stays
  // valid until the segment is removed.
  const std::vector<uint64_t>* Fingerprints(uint32_t id) const;

 private:
  // Takes `fp` out of segment `id`'s list (order is not kept).
  void Unlist(uint64_t fp, uint32_t id);

  std::unordered_map<uint64_t, Loc> map_;
  std::unordered_map<uint32_t, std::vector<uint64_t>> segments_;
};

}  // namespace shardcache::cache
