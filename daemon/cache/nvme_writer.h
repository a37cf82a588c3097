// NvmeWriter: everything the NVMe tier writes — the write queue that Insert feeds, the one writer
// thread that drains it into segment files, group commits to the RocksDB index, segment files
// created and dropped around the SegmentManager's decisions, and the idle-time enforcement of
// the budget and the free-space floor. In the shape of CacheLib navy's BlockCache insert path.
//
// Write path (one writer thread, fed by Insert):
//   1. append the chunk's extent (extent.h) at the open segment's write offset (4 KiB aligned,
//      O_DIRECT); extents that land back to back in one segment go out in one pwritev;
//   2. publish it in the ChunkIndex (readers in this process may hit it at once);
//   3. group commit: fdatasync the segment(s), then ONE synced RocksDB WriteBatch with the new
//      entries and the raised durable watermark. Commits happen when commit_bytes are pending,
//      when a segment is sealed, when the queue runs empty (at most every 50 ms then, unless
//      Flush waits), or after commit_interval_ms.
//   Data is therefore durable before its index entry; a crash loses at most the uncommitted
//   tail, never leaves an entry pointing at torn bytes.
// The block table of each extent is computed here from the chunk Insert was handed, which was
// verified against the manifest hash on arrival.
//
// Insert back-pressure: the queue holds up to write_queue_bytes; beyond that Insert waits until
// its deadline, then drops the chunk (queue_full_dropped). A chunk queued is Pending() until its
// batch is written.
//
// Room for a new segment: the SegmentManager's MakeRoom (budget, policy; segment_manager.h).
// Dropping a segment: its index range first (one synced DeleteRange), then its file (readers
// holding it keep their fd); a crash in between leaves an orphan file, which recovery deletes.
// ENOSPC while allocating → one forced eviction and a retry, then pass-through (not stored)
// with a nospace_backoff_ms back-off; RocksDB background errors → DB::Resume (index_db.cc).
//
// A failing disk (disk_health.h): every I/O error and lasting ENOSPC is reported to DiskHealth,
// which the writer also probes every disk_probe_interval_ms; while it is failing nothing is
// queued or written (chunks pass through).
//
// Thread safety: Insert, Pending, Flush, EnforceLimits, DropFiles, queued_bytes and counts may be
// called from any thread, WITHOUT the store's mutex held (those that need it take it). The
// mutex is NvmeStore's (one for the ChunkIndex, the SegmentManager and this queue); no file
// I/O or RocksDB call happens under it.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "common/mutex.h"
#include "daemon/cache/cache_options.h"
#include "daemon/cache/chunk_index.h"
#include "daemon/cache/disk_health.h"
#include "daemon/cache/index_db.h"
#include "daemon/cache/segment_file.h"
#include "daemon/cache/segment_manager.h"
#include "daemon/source/chunk_key.h"
#include "daemon/source/chunk_source.h"

namespace shardcache::cache {

struct WriterCounts {
  uint64_t written_bytes = 0;
  uint64_t enospc_passthrough = 0;
  uint64_t admission_declined = 0;
  uint64_t queue_full_dropped = 0;
};

class NvmeWriter {
 public:
  // `mu` guards `index` and `segments` (and this writer's queue); all must outlive the writer,
  // as must `db` and `health`.
  NvmeWriter(const CacheOptions& options, IndexDb* db, DiskHealth* health, Mutex* mu, ChunkIndex* index,
             SegmentManager* segments);
  // Stop().
  ~NvmeWriter();
  NvmeWriter(const NvmeWriter&) = delete;
  NvmeWriter& operator=(const NvmeWriter&) = delete;

  // Starts the writer thread.
  void Start();
  // Writes and commits everything still queued, then stops the writer thread. Insert refuses
  // and Flush returns at once from here on.
  void Stop();

  // Queues a verified chunk for writing; returns at once unless the queue holds more than
  // write_queue_bytes, then waits until `deadline`. False when not queued (already stored or
  // queued, deadline passed, stopping, disk failing).
  bool Insert(const ChunkKey& key, ChunkPtr chunk, std::chrono::steady_clock::time_point deadline);
  // A chunk still waiting in the write queue, or nullptr.
  ChunkPtr Pending(const ChunkKey& key) const;
  // Waits until every chunk queued before the call is written and committed.
  void Flush();
  // Forced evictions while over the budget (after a shrink) or under the free-space floor.
  void EnforceLimits();
  // Drops evicted segments: index range first (synced), then the file. Null files are skipped.
  void DropFiles(const std::vector<std::shared_ptr<SegmentFile>>& files);

  uint64_t queued_bytes() const;
  WriterCounts counts() const;

 private:
  struct QueueItem {
    ChunkKey key;
    ChunkPtr chunk;
  };
  struct Planned;
  struct Group;

  // When the writer last committed, enforced the limits and probed the disk.
  struct Times {
    std::chrono::steady_clock::time_point commit, limits, probe;
  };

  void WriterLoop();
  // WriterLoop with the queue empty: commits what is left, waits for work, and on an idle tick
  // persists access times now and then, enforces the limits and probes the disk (releasing
  // the mutex meanwhile). False when the writer is to stop.
  bool Idle(Times* last) REQUIRES(mu_);
  // Takes the next batch from the queue (up to kMaxBatchItems / kMaxBatchBytes).
  std::vector<QueueItem> TakeBatch(uint64_t* bytes) REQUIRES(mu_);
  // Writes a batch of queued chunks: extents that land back to back in one segment go out in
  // one pwritev, then are published together.
  void StoreBatch(std::vector<QueueItem>& items);
  // Makes sure a segment with room for `extent` bytes is open. Returns false when the chunk
  // is not to be stored (declined, disk full). Takes and releases the mutex itself.
  bool EnsureOpenSegment(uint64_t extent, uint64_t fingerprint);
  // Creates segment file `id`; on ENOSPC evicts one segment and tries once more.
  Result<std::shared_ptr<SegmentFile>> CreateSegment(uint32_t id);
  // Counts a chunk not stored for want of disk space and tells DiskHealth.
  void PassThroughNoSpace(const std::string& what);
  // One pwritev per IOV_MAX iovecs of the group's extents.
  Status WriteExtents(const Group& g);
  // Writes the group and publishes its chunks in the index (or seals the segment on failure).
  void WriteGroup(Group& g);
  void Commit();
  // DiskHealth::Probe with the store's view of free space. Writer thread, not under the mutex.
  void ProbeDisk();

  const CacheOptions& options_;
  IndexDb* const db_;
  DiskHealth* const health_;
  Mutex& mu_;
  ChunkIndex* const index_ PT_GUARDED_BY(mu_);
  SegmentManager* const segments_ PT_GUARDED_BY(mu_);
  CondVar writer_cv_;  // queue non-empty or stop
  CondVar space_cv_;   // queue has room
  CondVar idle_cv_;    // writer idle and everything committed
  std::deque<QueueItem> queue_ GUARDED_BY(mu_);
  std::unordered_map<ChunkKey, ChunkPtr, ChunkKeyHash> pending_ GUARDED_BY(mu_);
  uint64_t queue_bytes_ GUARDED_BY(mu_) = 0;
  std::vector<EntryPut> uncommitted_ GUARDED_BY(mu_);
  uint64_t uncommitted_bytes_ GUARDED_BY(mu_) = 0;
  int flush_waiters_ GUARDED_BY(mu_) = 0;  // Flush() callers: the next idle commit is not put off
  bool writer_busy_ GUARDED_BY(mu_) = false;
  bool stop_ GUARDED_BY(mu_) = false;
  std::chrono::steady_clock::time_point enospc_backoff_until_{};  // writer thread only

  std::atomic<uint64_t> written_bytes_{0}, enospc_passthrough_{0}, admission_declined_{0}, queue_full_dropped_{0};
  std::thread thread_;
};

}  // namespace shardcache::cache
