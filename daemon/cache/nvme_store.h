// NvmeStore: the NVMe tier — chunk bytes in preallocated segment files (segment_file.h), their
// locations in a RocksDB index (index_db.h) mirrored by a compact in-memory map (chunk_index.h),
// whole-segment eviction by a pluggable policy (eviction_policy.h) within a byte budget
// (segment_manager.h), reads with io_uring + O_DIRECT (io_reader.h), every read verified.
// The façade over navy-shaped units: ChunkIndex (where each chunk is), SegmentManager (segment
// table, budget, victims), NvmeWriter (queue, writer thread, group commit; nvme_writer.h, which
// documents the write path and its durability) and recovery at Open (nvme_recovery.h). The
// store itself does the reads.
//
// On-disk extent of one chunk (index format 2; extent.h): the chunk bytes padded to 4 KiB, then
// a block table of xxh3-64 per kVerifyBlockBytes block, computed by the writer from the
// verified chunk it was handed.
//   * whole-chunk reads (Lookup, and ReadPieces of a whole chunk) are verified against the
//     manifest's xxh3-128;
//   * partial reads (ReadPieces) are verified block by block against the table;
//   * runs (chunk_run.h: sample bytes kept without their chunk) are read whole by Lookup and
//     verified against their trailer.
// ReadPieces reads straight into the caller's buffer (an arena slot) when the buffer is 4 KiB
// aligned and the piece starts and ends on block boundaries (a whole chunk-sized record, say);
// otherwise into a bounce buffer and one copy. An entry that fails to read or verify is dropped
// from the map and from RocksDB (not synced: one that reappears after a crash is verified again).
//
// A failing disk (disk_health.h): a failed read is a miss (and reported); while the disk is
// failing nothing is queued or written (nvme_writer.h).
//
// Thread safety: all public methods are safe from any thread. mu_ guards the ChunkIndex, the
// SegmentManager and the writer's queue (the writer shares it); no file I/O or RocksDB call
// happens under it. Lock order: mu_ before AccessPlan's lock (the clairvoyant policy reads the
// plan while mu_ is held). The writer's methods take mu_ themselves: the store never calls them
// with mu_ held.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "common/metrics.h"
#include "common/mutex.h"
#include "common/stats.h"
#include "daemon/cache/access_plan.h"
#include "daemon/cache/cache_options.h"
#include "daemon/cache/chunk_index.h"
#include "daemon/cache/chunk_run.h"
#include "daemon/cache/disk_health.h"
#include "daemon/cache/eviction_policy.h"
#include "daemon/cache/extent.h"
#include "daemon/cache/index_db.h"
#include "daemon/cache/nvme_recovery.h"
#include "daemon/cache/nvme_writer.h"
#include "daemon/cache/scratch_pool.h"
#include "daemon/cache/segment_file.h"
#include "daemon/cache/segment_manager.h"
#include "daemon/source/chunk_key.h"
#include "daemon/source/chunk_source.h"

namespace shardcache::cache {

struct NvmeLookup {
  ChunkKey key;
  uint64_t length = 0;   // expected chunk length (manifest)
  Hash128 hash;          // expected hash (manifest)
  // Set for a run (chunk_run.h; key is its RunKey, length its RunStoredBytes): checked against
  // its trailer instead of `hash`.
  const RunId* run = nullptr;
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
  NvmeStore(const CacheOptions& options, uint64_t configured_size_bytes, std::unique_ptr<IndexDb> db,
            std::unique_ptr<DiskHealth> health, const AccessPlan* plan);
  static Result<std::unique_ptr<NvmeStore>> OpenIndexAndRecover(const CacheOptions& options,
                                                                uint64_t configured_size_bytes,
                                                                const AccessPlan* plan);
  // Where a stored chunk is, with its segment marked as used now (for lru);
  // nullopt when it is not stored.
  std::optional<std::pair<Loc, std::shared_ptr<SegmentFile>>> TouchLocked(uint64_t fp) REQUIRES(mu_);
  struct PieceJob;
  // The pieces the index holds (marking their segments used now); empty pieces are hits at once.
  std::vector<PieceJob> FindPieces(std::span<const NvmePiece> pieces, std::vector<bool>* hit);
  // Removes the entry if it still points at `loc`; true when this call removed it.
  bool DropEntry(uint64_t fp, const Loc& loc);

  const CacheOptions options_;
  const std::unique_ptr<IndexDb> db_;
  const std::unique_ptr<EvictionPolicy> policy_;
  const std::unique_ptr<DiskHealth> health_;
  RecoveryStats recovery_;

  // Bounce buffers and table pages of ReadPieces: at most 4 buffers of up to 1 MiB kept between
  // reads (see scratch_pool.h).
  ScratchPool scratch_{4, 1ull << 20};
  mutable Mutex mu_;
  ChunkIndex index_ GUARDED_BY(mu_);
  SegmentManager segments_ GUARDED_BY(mu_);
  NvmeWriter writer_;  // shares mu_; declared after what it points at, so it stops first

  std::atomic<uint64_t> hits_{0}, misses_{0}, checksum_failures_{0};
  bool io_uring_ = false;
  metrics::SourceHandle stats_source_;  // reset first thing in the destructor
};

}  // namespace shardcache::cache
