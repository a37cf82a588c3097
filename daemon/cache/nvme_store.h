// NvmeStore: the NVMe tier — chunk bytes in preallocated segment files (segment_file.h), their
// locations in a RocksDB index (index_db.h) mirrored by a compact in-memory map, whole-segment
// eviction by a pluggable policy (eviction_policy.h), reads with io_uring + O_DIRECT
// (io_reader.h), every read verified.
//
// On-disk extent of one chunk (index format 2; extent.h): the chunk bytes padded to 4 KiB, then
// a block table of xxh3-64 per kVerifyBlockBytes block. The table is computed by the writer
// from the chunk it was handed, which was verified against the manifest hash on arrival.
//   * whole-chunk reads (Lookup, and ReadPieces of a whole chunk) are verified against the
//     manifest's xxh3-128;
//   * partial reads (ReadPieces) are verified block by block against the table.
// ReadPieces reads straight into the caller's buffer (an arena slot) when the buffer is 4 KiB
// aligned and the piece starts and ends on block boundaries (a whole chunk-sized record, say);
// otherwise into a bounce buffer and one copy.
//
// Write path (one writer thread, fed by Insert):
//   1. append the chunk at the open segment's write offset (4 KiB aligned, O_DIRECT);
//   2. publish it in the in-memory map (readers in this process may hit it at once);
//   3. group commit: fdatasync the segment(s), then ONE synced RocksDB WriteBatch with the new
//      entries and the raised durable watermark. Commits happen when commit_bytes are pending,
//      when a segment is sealed, when the queue runs empty, or after commit_interval_ms.
//   Data is therefore durable before its index entry; a crash loses at most the uncommitted
//   tail, never leaves an entry pointing at torn bytes.
//
// Budget. Allocated bytes under `dir` = segments × segment_bytes (each fallocated to full size)
// + the index directory + two directory inodes. A new segment is allocated only when
//   (segments + 1) × segment_bytes + max(reserve, measured index + min(8 MiB, reserve/2)) + 8 KiB ≤ size
// and the file system keeps its free-space floor; otherwise a victim segment is evicted
// (policy decides; it may decline, and the chunk is then served but not stored). The index
// allowance is the stated overhead: by default 8 MiB + size/512. A size larger than the file
// system can hold above its floor is fitted to it at Open and SetSizeBytes (cache_dir.h); Stats
// reports both. A chunk whose extent is larger than a segment is never stored.
//
// Eviction of a segment: entries leave the map, one synced DeleteRange removes them from
// RocksDB, then the file is unlinked (readers holding it keep their fd). ENOSPC while
// allocating → one forced eviction and a retry, then pass-through (not stored) with a 1 s
// back-off; RocksDB background errors → DB::Resume (index_db.cc).
//
// A failing disk (disk_health.h): every I/O error and lasting ENOSPC is reported to DiskHealth,
// which the writer also probes about once a second; while it is failing nothing is queued or
// written (chunks pass through) and a failed read is a miss.
//
// Start-up (Open) reads the index, not the segments: segment records and entries are
// iterated, entries beyond a segment's durable watermark or in a missing/short file are
// dropped, segment files without a record are deleted. Every surviving segment is sealed; new
// chunks go to new segments. In-memory cost: one map node per chunk (~48 B) + 8 B in its
// segment's list.
//
// Thread safety: all public methods are safe from any thread. mu_ guards the map, the segment
// table and the queue; no file I/O or RocksDB call happens under it. Lock order: mu_ before
// AccessPlan's lock (the clairvoyant policy reads the plan while mu_ is held).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/metrics.h"
#include "common/mutex.h"
#include "common/stats.h"
#include "daemon/cache/access_plan.h"
#include "daemon/cache/cache_options.h"
#include "daemon/source/chunk_key.h"
#include "daemon/cache/disk_health.h"
#include "daemon/cache/eviction_policy.h"
#include "daemon/cache/extent.h"
#include "daemon/cache/index_db.h"
#include "daemon/cache/scratch_pool.h"
#include "daemon/cache/segment_file.h"
#include "daemon/source/chunk_source.h"

namespace shardcache::cache {

struct NvmeLookup {
  ChunkKey key;
  uint64_t length = 0;   // expected chunk length (manifest)
  Hash128 hash;          // expected hash (manifest)
};

// Bytes [offset, offset + length) of a stored chunk, to be copied to `dest` (ReadPieces).
struct NvmePiece {
  ChunkKey key;
  uint64_t chunk_length = 0;  // expected chunk length (manifest)
  Hash128 chunk_hash;         // expected hash (manifest), for whole-chunk pieces
  uint64_t offset = 0;
  uint64_t length = 0;
  uint8_t* dest = nullptr;
};

struct RecoveryStats {
  uint64_t segments = 0;
  uint64_t entries = 0;
  uint64_t dropped_entries = 0;    // beyond watermark, missing segment, malformed
  uint64_t dropped_segments = 0;   // file missing or shorter than its watermark
  uint64_t orphan_files = 0;       // segment files without a record (crash before first commit)
  double seconds = 0;
};

struct NvmeStats {
  uint64_t size_bytes = 0;          // budget
  uint64_t segment_bytes = 0;
  uint64_t segments = 0;
  uint64_t segment_allocated_bytes = 0;
  uint64_t index_bytes = 0;         // measured RocksDB directory
  uint64_t index_memory_bytes = 0;  // RocksDB's memtables, block cache and table readers
  uint64_t index_allowance_bytes = 0;
  uint64_t configured_size_bytes = 0;  // cache.size as asked; size_bytes is what the file system holds
  uint64_t entries = 0;
  uint64_t queued_bytes = 0;
  uint64_t written_bytes = 0;
  uint64_t hits = 0;
  uint64_t misses = 0;
  uint64_t evicted_segments = 0;
  uint64_t checksum_failures = 0;
  uint64_t enospc_passthrough = 0;
  uint64_t admission_declined = 0;
  uint64_t queue_full_dropped = 0;
  bool io_uring = false;
  const char* policy = "";
  std::string disk_problem;         // why the disk is failing (disk_health.h); "" when healthy
};

class NvmeStore final : public stats::Source {
 public:
  // Opens or creates the tier in options.dir and recovers it (see above) before returning. An
  // index that cannot be read (corrupt, another format, an I/O error) is moved aside to
  // options.dir/index.unreadable-<time> with an error line, and the tier starts empty.
  // `plan` must outlive the store; it may be null unless eviction is clairvoyant.
  static Result<std::unique_ptr<NvmeStore>> Open(const CacheOptions& options, const AccessPlan* plan);
  // Writes and commits everything still queued, then stops the writer.
  ~NvmeStore();
  NvmeStore(const NvmeStore&) = delete;
  NvmeStore& operator=(const NvmeStore&) = delete;

  // For each request the verified chunk, or nullptr on a miss. An entry that fails to read or
  // verify is dropped (counted in checksum_failures) and reported as a miss.
  std::vector<ChunkPtr> Lookup(std::span<const NvmeLookup> requests);
  // Copies each piece to its dest, verified (see the header comment); per piece true on a hit,
  // false on a miss. A stored chunk whose bytes fail to read or verify is dropped (counted in
  // checksum_failures) and reported as a miss; its dest may then hold garbage.
  std::vector<bool> ReadPieces(std::span<const NvmePiece> pieces);
  // True when the chunk has an index entry (no I/O, not verified).
  bool Contains(const ChunkKey& key) const;
  // A chunk still waiting in the write queue, or nullptr.
  ChunkPtr Pending(const ChunkKey& key) const;

  // Queues a verified chunk for writing; returns at once unless the queue holds more than
  // write_queue_bytes, then waits until `deadline`. False when not queued (already stored or
  // queued, deadline passed, store closing).
  bool Insert(const ChunkKey& key, ChunkPtr chunk, std::chrono::steady_clock::time_point deadline);

  // Waits until every chunk queued before the call is written and committed.
  void Flush();

  // New budget; shrinking evicts segments at once (policy's forced choice) while serving.
  void SetSizeBytes(uint64_t size_bytes);
  // Drops every entry of one dataset version; segments left empty are freed. Flushes first.
  Status EvictVersion(const Hash128& version);

  NvmeStats Stats() const;
  // Evictions, writes, checksum failures, declined admissions and the tier's gauges, for
  // /metrics (cache_metrics.h).
  void VisitStats(const stats::Visitor& visit) const override;
  // Why the disk is failing (disk_health.h); "" while it is healthy.
  std::string disk_problem() const { return health_->problem(); }
  const RecoveryStats& recovery() const { return recovery_; }
  const std::string& dir() const { return options_.dir; }
  // The RocksDB index, for small metadata blobs (manifests, sample indexes).
  IndexDb& index_db() { return *db_; }

 private:
  struct Loc {
    uint32_t segment;
    uint32_t length;
    uint64_t offset;
    bool operator==(const Loc& o) const {
      return segment == o.segment && length == o.length && offset == o.offset;
    }
  };
  static_assert(sizeof(Loc) == 16);
  struct Segment {
    std::shared_ptr<SegmentFile> file;
    std::vector<uint64_t> fingerprints;   // live chunks
    uint64_t write_offset = 0;
    uint64_t durable_bytes = 0;
    uint64_t last_tick = 0;
    bool sealed = false;
    bool record_dirty = false;            // segment record must be rewritten at next commit
  };
  struct QueueItem {
    ChunkKey key;
    ChunkPtr chunk;
  };

  NvmeStore(const CacheOptions& options, uint64_t configured_size_bytes, std::unique_ptr<IndexDb> db,
            std::unique_ptr<DiskHealth> health, const AccessPlan* plan);
  // Start-up: removes orphan segment files, opens the recorded segments, loads the index.
  // Called before the store is shared; holds mu_ only for the analysis.
  Status Recover() REQUIRES(mu_);
  // Opens each recorded segment (dropping one whose file is missing, unreadable or shorter
  // than its durable watermark, with its entries) into segments_, ordered by last access.
  Status OpenRecordedSegments(const std::map<uint32_t, SegmentRecord>& records, const std::set<uint32_t>& files)
      REQUIRES(mu_);
  // Loads the index entries into index_, dropping those that point past a durable watermark
  // or into a missing segment.
  Status LoadEntries() REQUIRES(mu_);
  static Result<std::unique_ptr<NvmeStore>> OpenIndexAndRecover(const CacheOptions& options,
                                                                uint64_t configured_size_bytes,
                                                                const AccessPlan* plan);
  void WriterLoop();
  // Writes a batch of queued chunks: extents that land back to back in one segment go out in
  // one pwritev, then are published together.
  void StoreBatch(std::vector<QueueItem>& items);
  // Makes sure a segment with room for `extent` bytes is open. Returns false when the chunk
  // is not to be stored (declined, disk full). Takes and releases mu_ itself.
  bool EnsureOpenSegment(uint64_t extent, uint64_t fingerprint);
  enum class Room { kMade, kDeclined, kDiskFull };
  // REQUIRES: mu_ held. Evicts until one more segment fits the budget and the free-space floor
  // (`headroom` above it now); the evicted files go to `victims` for DropFiles. kDeclined: the
  // policy keeps what is stored over this chunk; kDiskFull: short of disk with nothing to evict.
  Room MakeRoomLocked(uint64_t measured_index_bytes, int64_t headroom, uint64_t fingerprint,
                      std::vector<std::shared_ptr<SegmentFile>>* victims) REQUIRES(mu_);
  // Creates segment file `id`; on ENOSPC evicts one segment and tries once more.
  Result<std::shared_ptr<SegmentFile>> CreateSegment(uint32_t id);
  // Counts a chunk not stored for want of disk space and tells DiskHealth.
  void PassThroughNoSpace(const std::string& what);
  // Bytes allocated under dir with `segments` segments: the budget's one formula (see above).
  uint64_t AllocatedBytes(size_t segments, uint64_t measured_index_bytes) const REQUIRES(mu_);
  struct Planned;
  struct Group;
  // One pwritev per IOV_MAX iovecs of the group's extents.
  Status WriteExtents(const Group& g);
  // Writes the group and publishes its chunks in the index (or seals the segment on failure).
  void WriteGroup(Group& g);
  void Commit();
  // Floor/budget enforcement when idle: evicts (forced) while over.
  void EnforceLimits();

  // Removes a segment from the table and the map; the caller passes the
  // returned file to DropFiles after releasing mu_.
  std::shared_ptr<SegmentFile> EvictLocked(uint32_t id) REQUIRES(mu_);
  std::optional<uint32_t> PickVictimLocked(std::optional<uint64_t> incoming) REQUIRES(mu_);
  void RemoveFingerprintLocked(uint64_t fp, uint32_t segment) REQUIRES(mu_);
  void DropFiles(const std::vector<std::shared_ptr<SegmentFile>>& files);
  // Where a stored chunk is, with its segment marked as used now (for lru);
  // nullopt when it is not stored.
  std::optional<std::pair<Loc, std::shared_ptr<SegmentFile>>> TouchLocked(uint64_t fp) REQUIRES(mu_);
  struct PieceJob;
  // The pieces the index holds (marking their segments used now); empty pieces are hits at once.
  std::vector<PieceJob> FindPieces(std::span<const NvmePiece> pieces, std::vector<bool>* hit);
  // Removes the entry if it still points at `loc`; true when this call removed it.
  bool DropEntry(uint64_t fp, const Loc& loc);
  uint64_t IndexAllowance(uint64_t measured_index_bytes) const;
  // DiskHealth::Probe with the store's view of free space. Writer thread, not under mu_.
  void ProbeDisk();

  const CacheOptions options_;
  const std::unique_ptr<IndexDb> db_;
  const std::unique_ptr<EvictionPolicy> policy_;
  const std::unique_ptr<DiskHealth> health_;
  RecoveryStats recovery_;

  // Bounce buffers and table pages of ReadPieces: at most 4 buffers of up to 1 MiB kept between
  // reads (see scratch_pool.h).
  ScratchPool scratch_{4, 1ull << 20};
  mutable Mutex mu_;
  CondVar writer_cv_;                    // queue non-empty or stop
  CondVar space_cv_;                     // queue has room
  CondVar idle_cv_;                      // writer idle and everything committed
  uint64_t size_bytes_ GUARDED_BY(mu_);  // fitted to the file system
  uint64_t configured_size_bytes_ GUARDED_BY(mu_);
  std::unordered_map<uint64_t, Loc> index_ GUARDED_BY(mu_);
  std::map<uint32_t, Segment> segments_ GUARDED_BY(mu_);
  uint32_t open_segment_ GUARDED_BY(mu_) = 0;  // 0 = none; ids start at 1
  uint32_t next_segment_id_ GUARDED_BY(mu_) = 1;
  uint64_t tick_ GUARDED_BY(mu_) = 0;
  std::vector<EntryPut> uncommitted_ GUARDED_BY(mu_);
  uint64_t uncommitted_bytes_ GUARDED_BY(mu_) = 0;
  std::deque<QueueItem> queue_ GUARDED_BY(mu_);
  std::unordered_map<ChunkKey, ChunkPtr, ChunkKeyHash> pending_ GUARDED_BY(mu_);
  uint64_t queue_bytes_ GUARDED_BY(mu_) = 0;
  bool writer_busy_ GUARDED_BY(mu_) = false;
  bool stop_ GUARDED_BY(mu_) = false;
  uint64_t measured_index_bytes_ GUARDED_BY(mu_) = 0;
  std::chrono::steady_clock::time_point enospc_backoff_until_{}; // writer thread only

  std::atomic<uint64_t> written_bytes_{0}, hits_{0}, misses_{0}, evicted_segments_{0},
      checksum_failures_{0}, enospc_passthrough_{0}, admission_declined_{0}, queue_full_dropped_{0};
  bool io_uring_ = false;
  std::thread writer_;
  metrics::SourceHandle stats_source_;  // reset first thing in the destructor
};

}  // namespace shardcache::cache
