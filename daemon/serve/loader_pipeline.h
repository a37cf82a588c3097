// LoaderPipeline (the prefetcher): one open loader's walk along its epoch plan.
//
// A background thread per loader keeps the loader ahead of its trainer:
//   1. it assembles the next `prefetch_batches` batches into free arena slots, in plan order,
//      so NextBatch returns at once when the data is there;
//   2. beyond those, it issues prefetch-priority warm reads of the chunks the loader will need
//      next, within `lookahead_bytes` of chunk data, so the cache tiers below (single-flight,
//      shared by every loader on the node) fetch ahead of demand. The chunks are sorted into
//      runs of consecutive chunks, one warm read each: a cold cache fetches them as upstream
//      ranges over many streams at once;
//   3. the loader's first batch goes alone: no other batch and no warm read starts until it is
//      assembled, so that on a cold start its reads do not share the link with the next
//      batch's and the warm reads' (traced at 10 ms / 64 KiB windows: the first batch's ranges
//      took 35-67 ms behind them, 2-3x their own round trips; the trainer waits for this batch
//      alone, and the next ones start a batch's time later at most).
// The plan decides the order; timing never changes which samples a batch holds.
//
// Delivery: without a batch ring, Next() hands out the assembled batches one per NextBatch
// request. With one (local protocol 3), each batch is published into the ring as soon as it is
// assembled, in plan order, while fewer than ring entries of this loader's batches are held by
// the client; the client takes them from shared memory and WaitPublished() only answers a
// client that found the ring empty.
//
// Thread-per-loader is deliberate: a node serves at most a few dozen trainers with a few
// loaders each, the threads mostly wait, and a blocking loop is easier to get right than a
// state machine. Chunk reads themselves run on the shared BatchAssembler pool.
//
// Thread safety: Next(), samples_consumed() and the destructor may be called from the
// connection thread while the pipeline thread runs; state is guarded by mu_.
// Lock order: LoaderPipeline::mu_ before Arena::mu_.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_set>

#include "common/mutex.h"
#include "common/status.h"
#include "daemon/plan/rank_slice.h"
#include "daemon/serve/arena.h"
#include "daemon/serve/batch_assembler.h"
#include "daemon/serve/sample_warmer.h"
#include "daemon/serve/serve_defaults.h"
#include "daemon/serve/serve_metrics.h"
#include "daemon/source/chunk_key.h"
#include "shardcache/batch_ring.h"

namespace shardcache::serve {

struct LoaderPipelineOptions {
  // Batches assembled ahead into free slots. Default: 2.
  uint32_t prefetch_batches = 2;
  // Slots this loader may hold in all (assembling, queued, or delivered and not released), so
  // that one loader cannot take the slots its client's other loaders need. Default: no limit.
  uint32_t max_slots = UINT32_MAX;
  // Batches being assembled at the same time (each one's chunk reads already run in parallel;
  // a second one keeps the disk busy while the first one's last read finishes). Default: 2.
  uint32_t assemble_depth = 2;
  // Chunk bytes warmed ahead of the assembled batches. 0 = no warm reads. Default: 256 MiB.
  uint64_t lookahead_bytes = kDefaultLookaheadBytes;
  // When set, overrides lookahead_bytes and may change at any time (LocalService's run-time
  // setter). Must outlive the pipeline.
  const std::atomic<uint64_t>* lookahead_bytes_live = nullptr;
  // The tiers can keep the whole dataset (LoaderFactory decides): a warmed chunk stops counting
  // against the lookahead once a tier holds it, not only once assembly passes it, so the warm
  // reads keep the link busy past a slow chunk instead of waiting for assembly to reach it.
  // Then the lookahead bounds the bytes requested and not yet landed, and at most
  // kMaxWarmTrackedChunks chunks are tracked ahead of assembly.
  bool lookahead_in_flight_only = false;
  // false (LoaderFactory: a global shuffle of a dataset larger than the tiers): no warm reads,
  // and batches fetch only the blocks their samples cover (ReadOptions::whole_chunks), since a
  // chunk fetched whole would be pushed out before most of its samples come up.
  bool whole_chunks = true;
  // With whole_chunks: the first this many batches read what no tier holds pieces-only (only
  // the blocks their samples cover), while the warm reads fetch their chunks whole as for any
  // later batch. The first batch of a cold epoch then waits for about its own bytes, not for a
  // batch's worth of whole chunks (LoaderFactory sets it when the source fetches block ranges).
  uint32_t blocks_first_batches = 0;
  // With lookahead_in_flight_only: warm reads fetch each sample's own blocks in plan order
  // (SampleWarmer) instead of whole chunks, and batches read what no tier holds pieces-only.
  // For a global shuffle from a source that batches block ranges (LoaderFactory): whole chunks
  // in order of first need come in random order there, and the trainer waits for nearly all.
  bool warm_samples = false;
  // Write each batch's field table after its payload (tar datasets; sample_fields.h).
  bool fields = false;
};

class LoaderPipeline {
 public:
  struct Delivered {
    bool end_of_epoch = false;
    uint32_t slot = 0;
    uint64_t seq = 0;
    uint64_t wait_us = 0;
    AssembledBatch batch;
  };

  // Starts the pipeline thread, which reads `slice` (rank, resume point and worker are in it)
  // in batches of its batch size. With a `ring`, batches are delivered through it (see above);
  // its max_samples must be at least the batch size.
  LoaderPipeline(uint64_t id, Arena& arena, BatchAssembler& assembler,
                 std::shared_ptr<SampleLocator> locator, plan::RankSlice slice,
                 LoaderPipelineOptions options, std::unique_ptr<batch_ring::RingWriter> ring = nullptr);
  // Stops the thread (waiting for a batch being assembled) and frees every slot of this loader,
  // delivered or not.
  ~LoaderPipeline();
  LoaderPipeline(const LoaderPipeline&) = delete;
  LoaderPipeline& operator=(const LoaderPipeline&) = delete;

  // The next batch in plan order, its slot marked delivered; end_of_epoch once every sample of
  // this rank was delivered. ResourceExhausted at once when every arena slot is held and none by
  // this loader (the client must release batches first: waiting could never succeed);
  // DeadlineExceeded when the data is not ready by `deadline` (the batch stays queued); a read
  // error is returned once, and the batch is retried on the next call. Cancelled as soon as
  // `gone` (asked every kIdlePoll while waiting) says the client went away.
  using ClientGone = std::function<bool()>;
  Result<Delivered> Next(std::chrono::steady_clock::time_point deadline, const ClientGone& gone = {});

  // With a ring: waits until ring entry `index` is published. end_of_epoch once every sample of
  // this rank was published and `index` is past the last batch; InvalidArgument for an index
  // beyond the next unpublished one; ResourceExhausted at once when the client holds as many of
  // this loader's batches as the ring has entries (or every arena slot), since only it can
  // free one; DeadlineExceeded and read errors as for Next(). FailedPrecondition without a ring.
  struct RingWait {
    bool end_of_epoch = false;
    uint64_t published = 0;  // entries published when the wait ended
    uint64_t wait_us = 0;
  };
  Result<RingWait> WaitPublished(uint64_t index, std::chrono::steady_clock::time_point deadline,
                                 const ClientGone& gone = {});
  // The client released one of this loader's slots: a batch waiting for ring room is published.
  void OnReleased();
  // The ring batches are published into; null without one.
  const batch_ring::RingWriter* ring() const { return ring_.get(); }

  // Stops the pipeline thread and makes a waiting or later Next() return Cancelled.
  void Cancel();

  uint64_t id() const { return id_; }
  uint64_t record_bytes() const { return locator_->record_bytes(); }
  // The rank's resume point after the batches delivered so far (RankSlice::RankConsumedAfter).
  uint64_t samples_consumed() const;
  // Samples this loader delivers in all.
  uint64_t loader_samples() const { return total_; }
  const plan::RankSlice& slice() const { return slice_; }

 private:
  void Run();
  // Another batch may start assembling now.
  bool CanStartLocked() const REQUIRES(mu_);
  // Starts assembling slice samples [first, first + count) into `slot`. Called without mu_.
  void StartAssembly(uint64_t seq, uint32_t slot, uint64_t first, uint64_t count);
  // The assembler's report of assembly `seq` (any thread, without mu_).
  void OnAssembled(uint64_t seq, Status s, AssembledBatch batch);
  // Issues warm reads; true when it made progress.
  bool Warm();
  // Moves ready batches into the ring while it has room.
  void PublishLocked() REQUIRES(mu_);
  // The loader's error (once), or — while samples remain — ResourceExhausted
  // when only the client can free a slot for the next batch (`ring_full`: its ring entries are
  // all held); OK otherwise.
  Status BlockedLocked(bool ring_full) REQUIRES(mu_);
  // Counts a batch handed to the client.
  void CountDelivered(const Delivered& d);
  // Counts how long a client waited for a batch.
  void CountWait(uint64_t wait_us);
  // DeadlineExceeded for a batch that is not ready, saying why when no slot
  // is free for it.
  Status NotReadyLocked() const REQUIRES(mu_);
  // Waits (mu_ released) until woken, `deadline` or kIdlePoll; Cancelled
  // when the client is gone or the loader stopped.
  Status WaitLocked(std::chrono::steady_clock::time_point deadline, const ClientGone& gone) REQUIRES(mu_);

  const uint64_t id_;
  Arena& arena_;
  BatchAssembler& assembler_;
  const std::shared_ptr<SampleLocator> locator_;
  const Hash128 version_id_;  // of the dataset version read: the version part of its ChunkKeys
  const plan::RankSlice slice_;
  const LoaderPipelineOptions options_;
  const uint64_t batch_size_;
  const uint64_t total_;  // samples this loader delivers

  mutable Mutex mu_;
  CondVar cv_;
  bool stop_ GUARDED_BY(mu_) = false;
  uint32_t assembling_ GUARDED_BY(mu_) = 0;  // assemblies whose reads are running
  // Assemblies started and not yet handed to ready_, by sequence number; order_ lists the ones
  // still to be delivered, in plan order (cancelled ones stay in inflight_ until they report).
  struct InFlight {
    uint32_t slot = 0;
    uint64_t first = 0, count = 0;
    bool done = false;
    bool cancelled = false;
    AssembledBatch batch;
  };
  std::map<uint64_t, InFlight> inflight_ GUARDED_BY(mu_);
  std::deque<uint64_t> order_ GUARDED_BY(mu_);
  uint64_t next_assembly_ GUARDED_BY(mu_) = 0;
  bool first_assembled_ GUARDED_BY(mu_) = false;  // the loader's first batch reported (see 3. above)
  uint64_t assemble_index_ GUARDED_BY(mu_) = 0;  // next slice index to assemble
  uint64_t consumed_ GUARDED_BY(mu_) = 0;        // slice index after the last delivered batch
  uint64_t next_seq_ GUARDED_BY(mu_) = 0;
  Status error_ GUARDED_BY(mu_);
  std::deque<Delivered> ready_ GUARDED_BY(mu_);
  const std::unique_ptr<batch_ring::RingWriter> ring_ PT_GUARDED_BY(mu_);  // the pointer is const; Publish() under mu_

  // Warm-read bookkeeping, used by the pipeline thread only.
  struct Warmed {
    uint64_t index;  // slice index of the sample that needed it
    uint32_t shard;
    uint64_t chunk;
    uint64_t bytes;
  };
  uint64_t warm_index_ = 0;
  uint64_t indexes_loaded_to_ = 0;  // the warm walk's sample indexes are loaded below this
  std::deque<Warmed> warmed_;  // warmed chunks assembly has not passed yet (keys in warmed_keys_)
  std::unordered_set<ChunkKey, ChunkKeyHash> warmed_keys_;
  // lookahead_in_flight_only: the warmed chunks no tier held at the last look.
  std::vector<Warmed> unlanded_;
  uint64_t warmed_bytes_ = 0;  // bytes counted against the lookahead
  // Drops what assembly passed (before slice index `base`) and, in lookahead_in_flight_only
  // mode, stops counting chunks a tier now holds.
  void ReleaseWarmed(uint64_t base);
  struct WarmRun {
    uint32_t shard;
    uint64_t first;
    uint64_t count;
    uint64_t last_needed_at;  // the latest slice index that needs one of its chunks
  };
  bool SendWarm(const WarmRun& run);
  // Loads, in parallel, the sample indexes of the shards the warm walk meets from slice index
  // `from` on (a global shuffle meets a new shard at almost every sample).
  void LoadIndexesAhead(uint64_t from);
  // warm_samples: the walk that issues the warm reads instead of the chunk runs above.
  std::unique_ptr<SampleWarmer> sample_warmer_;
  // assemble_index_, readable by warm reads waiting in the pool (which may outlive this object).
  std::shared_ptr<std::atomic<uint64_t>> assembled_from_ = std::make_shared<std::atomic<uint64_t>>(0);
  std::deque<WarmRun> unsent_;  // warm reads decided on but not yet accepted by the pool

  std::thread thread_;
  // The series of this loader's (dataset, rank) pair (serve_metrics.h), shared with the other
  // loaders of the pair; owned by the metrics registry.
  LoaderSeries series_;
};

}  // namespace shardcache::serve
