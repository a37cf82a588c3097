// SegmentManager: the NVMe tier's segment table and its byte budget — which segments exist,
// which one is open for writing, how far each is written and durable, when each was last used,
// and which one to give up when there is no room (the eviction policy decides; it may decline).
// In the shape of CacheLib navy's RegionManager. It does no I/O: the writer (nvme_writer.h)
// creates, syncs and drops the files around its decisions, and recovery (nvme_recovery.h) adds
// the segments found at start-up.
//
// Budget. Allocated bytes under `dir` = segments × segment_bytes (each fallocated to full size)
// + the index directory + two directory inodes (AllocatedBytes, the budget's one formula). A new
// segment is allocated only when
//   (segments + 1) × segment_bytes + max(reserve, measured index + min(8 MiB, reserve/2)) + 8 KiB ≤ size
// and the file system keeps its free-space floor; otherwise a victim segment is evicted
// (MakeRoom: the policy decides; it may decline, and the chunk is then served but not stored).
// The index allowance is the stated overhead: by default 8 MiB + size/512. A size larger than
// the file system can hold above its floor is fitted to it at Open and SetSizeBytes
// (cache_dir.h); Stats reports both. A chunk whose extent is larger than a segment is never
// stored. While at the budget, a chunk that would fill space an eviction freed is first offered
// to the policy (EvictionPolicy::AdmitIntoFreedSpace).
//
// Eviction of a segment removes it from the table and its entries from the ChunkIndex at once;
// the caller then drops its index range and file (NvmeWriter::DropFiles), outside the mutex.
// The open segment is never a victim of MakeRoom, only of EnforceLimits' last resort.
//
// Thread safety: none of its own. NvmeStore's mutex is held around every call (the store and
// its writer hold it GUARDED_BY that mutex); the policy is called under it too
// (eviction_policy.h).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include "daemon/cache/cache_options.h"
#include "daemon/cache/chunk_index.h"
#include "daemon/cache/eviction_policy.h"
#include "daemon/cache/index_db.h"
#include "daemon/cache/segment_file.h"

namespace shardcache::cache {

// The cache directory and the index directory themselves (du counts their blocks).
constexpr uint64_t kDirOverheadBytes = 8192;
// Head-room for WAL and memtable flushes between two measurements of the index directory
// (capped at half the reserve, since the index is re-measured at every segment roll).
constexpr uint64_t kIndexGrowthBytes = 8ull << 20;

class SegmentManager {
 public:
  // `policy` and `index` must outlive the manager. `size_bytes`: the budget (fitted to the file
  // system); `configured_size_bytes`: cache.size as asked.
  SegmentManager(const CacheOptions& options, uint64_t configured_size_bytes, EvictionPolicy* policy,
                 ChunkIndex* index);

  // --- Budget
  // The index's share of the budget: max(reserve, measured + min(8 MiB, reserve/2)).
  uint64_t IndexAllowance(uint64_t measured_index_bytes) const;
  // Bytes allocated under dir with `segments` segments: the budget's one formula (see above).
  uint64_t AllocatedBytes(size_t segments, uint64_t measured_index_bytes) const;
  void SetSize(uint64_t size_bytes, uint64_t configured_size_bytes);
  uint64_t size_bytes() const { return size_bytes_; }
  uint64_t configured_size_bytes() const { return configured_size_bytes_; }
  // The index directory as last measured (IndexDb::DiskBytes); the writer re-measures it at
  // every segment roll and idle tick.
  void set_measured_index_bytes(uint64_t bytes) { measured_index_bytes_ = bytes; }
  uint64_t measured_index_bytes() const { return measured_index_bytes_; }

  enum class Room { kMade, kDeclined, kDiskFull };
  // Evicts until one more segment fits the budget (with the index measured at `measured`) and
  // the free-space floor (`headroom` above it now); the evicted files go to `victims` for
  // DropFiles. kDeclined: the policy keeps what is stored over the chunk `fp`; kDiskFull: short
  // of disk with nothing to evict.
  Room MakeRoom(uint64_t measured, int64_t headroom, uint64_t fp, std::vector<std::shared_ptr<SegmentFile>>* victims);
  // True when the chunk `fp` is not to fill space an eviction freed: the tier is at its budget
  // (one more segment would not fit) and the policy does not admit it.
  bool DeclinesIntoFreedSpace(uint64_t fp);
  // Over the budget (with the last measured index) or below the free-space floor.
  bool OverLimits(int64_t headroom) const;
  // A victim for EnforceLimits: the policy's forced choice among the sealed segments, else the
  // open segment; nullopt when there is no segment.
  std::optional<uint32_t> PickForcedVictim();

  // --- Victims
  // The policy's choice among the sealed segments; `incoming` as in EvictionPolicy::PickVictim.
  std::optional<uint32_t> PickVictim(std::optional<uint64_t> incoming);
  // Removes segment `id` from the table and its entries from the index; returns its file (for
  // DropFiles after the mutex is released), nullptr when there is no such segment.
  std::shared_ptr<SegmentFile> Evict(uint32_t id);
  // Evicts those of `ids` that exist, hold no live chunk and are not open.
  std::vector<std::shared_ptr<SegmentFile>> EvictEmpty(const std::set<uint32_t>& ids);
  uint64_t evicted() const { return evicted_; }

  // --- The open segment
  uint32_t open_id() const { return open_; }  // 0 = none; ids start at 1
  // True when a segment is open and has room for `extent` more bytes.
  bool OpenHasRoom(uint64_t extent) const;
  // Seals the open segment (when there is one); none is open afterwards.
  void SealOpen();
  // Takes the id for a new segment.
  uint32_t NextId() { return next_id_++; }
  // Adds the newly created segment `id` as the open one.
  void AddOpen(uint32_t id, std::shared_ptr<SegmentFile> file);
  // Where `extent` bytes go in the open segment (REQUIRES an open segment), moving its write
  // offset past them.
  struct Slot {
    uint32_t segment;
    uint64_t offset;
    std::shared_ptr<SegmentFile> file;
  };
  Slot Reserve(uint64_t extent);
  // After a failed write at `offset` of segment `id`: nothing is written behind it again.
  void SealAfterFailedWrite(uint32_t id, uint64_t offset);

  // --- Table
  size_t count() const { return segments_.size(); }
  bool Contains(uint32_t id) const { return segments_.count(id) > 0; }
  // A segment found at start-up, sealed, last used after those added before it (add them in
  // order of last access). Its record is rewritten at the next commit unless it says sealed.
  void AddRecovered(uint32_t id, std::shared_ptr<SegmentFile> file, const SegmentRecord& rec);
  void set_next_id(uint32_t id) { next_id_ = id; }
  // The durable watermark of segment `id`; nullopt when there is no such segment.
  std::optional<uint64_t> DurableBytes(uint32_t id) const;
  // A read of segment `id`: marks it used now (lru; its record is rewritten at the next
  // commit) and returns its file, nullptr when there is no such segment.
  std::shared_ptr<SegmentFile> MarkRead(uint32_t id);
  // Chunks were just written to segment `id`: marks it used now.
  void MarkWritten(uint32_t id);

  // --- Commit
  // True when some segment's record must be rewritten (access times to persist).
  bool AnyRecordDirty() const;
  // The records a group commit writes: every segment with data in it (`with_data`, also to be
  // synced first: `to_sync`) or with a dirty record; their records count as clean from here.
  void CollectRecords(const std::set<uint32_t>& with_data, uint64_t now_s,
                      std::vector<std::pair<uint32_t, SegmentRecord>>* records,
                      std::vector<std::shared_ptr<SegmentFile>>* to_sync);
  // The commit of `records` succeeded: their durable watermarks rise.
  void RaiseDurable(const std::vector<std::pair<uint32_t, SegmentRecord>>& records);

 private:
  struct Segment {
    std::shared_ptr<SegmentFile> file;
    uint64_t write_offset = 0;
    uint64_t durable_bytes = 0;
    uint64_t last_tick = 0;
    bool sealed = false;
    bool record_dirty = false;  // segment record must be rewritten at next commit
  };

  const uint64_t segment_bytes_;
  const uint64_t index_reserve_bytes_;
  EvictionPolicy* const policy_;
  ChunkIndex* const index_;
  uint64_t size_bytes_;
  uint64_t configured_size_bytes_;
  uint64_t measured_index_bytes_ = 0;
  std::map<uint32_t, Segment> segments_;
  uint32_t open_ = 0;
  uint32_t next_id_ = 1;
  uint64_t tick_ = 0;  // logical clock of segment use (lru)
  uint64_t evicted_ = 0;
};

}  // namespace shardcache::cache
