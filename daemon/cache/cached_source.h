// CachedSource: the cache tiers as a ChunkSource — DRAM (dram_cache.h) and NVMe
// (nvme_store.h) in front of an upstream ChunkSource (FileSource, GrpcSource, ...).
//
// ReadPieces (batch assembly): the same tiers, but an NVMe hit reads only the bytes asked for
// (see NvmeStore::ReadPieces) and is not copied into DRAM.
// ReadChunks, per chunk in order:  DRAM hit → chunk still in the NVMe write queue → NVMe hit
// (io_uring batch, verified) → upstream. Upstream fetches are single-flight per chunk across
// every caller of this CachedSource (16 concurrent readers of one cold chunk = 1 fetch), and a
// run of consecutive misses this caller leads is fetched as ONE range call (up to
// max_fetch_run_chunks). Fetched chunks are checked against the manifest hash, put in DRAM,
// queued for the NVMe writer and delivered at the same time — the caller never waits for disk.
//
// Faults. Upstream dead or stalled: callers get the upstream's Unavailable/DeadlineExceeded at
// their own deadline (followers of a stalled flight time out at theirs), while every chunk in
// DRAM/NVMe keeps being served; the next read after the upstream returns fetches again. A
// follower whose leader failed retries as leader while its deadline allows (at most 3 times).
// Disk full: see nvme_writer.h (evict, retry, then pass through without storing).
// OpenDataset/GetSampleIndex remember the last manifest and sample indexes in the index DB, so
// a restarted node serves its cached datasets while the upstream is unreachable.
//
// Clairvoyant eviction: the epoch planner hands the future read order to access_plan()
// (see access_plan.h for positions and the clock); demand reads advance the clock.
//
// Thread safety: all methods are safe from any thread.
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <string>

#include "common/metrics.h"
#include "common/mutex.h"
#include "common/stats.h"
#include "daemon/cache/access_plan.h"
#include "daemon/cache/cache_options.h"
#include "daemon/source/chunk_key.h"
#include "daemon/cache/dram_cache.h"
#include "daemon/cache/nvme_store.h"
#include "daemon/source/chunk_source.h"
#include "daemon/upstream/single_flight.h"

namespace shardcache::cache {

struct CacheStats {
  uint64_t dram_used_bytes = 0;
  uint64_t dram_budget_bytes = 0;
  uint64_t dram_entries = 0;
  bool nvme_enabled = false;
  NvmeStats nvme;
  uint64_t served_dram_bytes = 0;
  uint64_t served_nvme_bytes = 0;
  uint64_t served_upstream_bytes = 0;
  uint64_t hits_dram = 0;
  uint64_t hits_nvme = 0;
  uint64_t misses = 0;
  uint64_t upstream_fetched_chunks = 0;  // chunks fetched as flight leader
  uint64_t upstream_calls = 0;           // range calls to upstream
  uint64_t joined_flights = 0;           // chunks received from another caller's fetch
  uint64_t runs_kept = 0;                // sample ranges kept without their chunk (chunk_run.h)
  uint64_t run_hits = 0;                 // pieces answered by a kept run

  // One JSON object (for /status and `shardctl stat`).
  std::string ToJson() const;
};

class CachedSource final : public ChunkSource, public stats::Source {
 public:
  // Validates options, opens and recovers the NVMe tier (when size_bytes > 0) before returning.
  static Result<std::unique_ptr<CachedSource>> Open(const CacheOptions& options,
                                                    std::unique_ptr<ChunkSource> upstream);
  ~CachedSource() override;

  Result<std::vector<v1::DatasetSummary>> ListDatasets() override;
  Result<DatasetPtr> OpenDataset(const std::string& name) override;
  Result<std::string> GetSampleIndex(const DatasetPtr& dataset, uint32_t shard) override;
  Status ReadChunks(const DatasetPtr& dataset, uint32_t shard, uint64_t first, uint64_t count,
                    const ReadOptions& options, const ChunkSink& sink) override;
  // DRAM and the NVMe write queue answer from memory; NVMe answers with sub-chunk reads
  // (only the blocks a piece covers, straight into its destination where aligned); what no
  // tier holds is fetched whole through ReadChunks (single-flight, then stored), or with
  // options.whole_chunks false only its covering blocks, through the upstream's ReadPieces.
  Status ReadPieces(const DatasetPtr& dataset, uint32_t shard, std::span<const ChunkPiece> pieces,
                    const ReadOptions& options) override;
  // Fetches only the chunks no tier holds (no disk read for the rest).
  Status Prefetch(const DatasetPtr& dataset, uint32_t shard, uint64_t first, uint64_t count,
                  const ReadOptions& options) override;
  // DRAM and the NVMe write queue only; Holds also counts chunks stored on NVMe.
  bool ReadPiecesFromMemory(const DatasetPtr& dataset, uint32_t shard,
                            std::span<const ChunkPiece> pieces, FetchPriority priority) override;
  bool Holds(const DatasetPtr& dataset, uint32_t shard, uint64_t first, uint64_t count) override;
  bool HoldsPieces(const DatasetPtr& dataset, uint32_t shard, std::span<const ChunkPiece> pieces) override;
  // The larger of the NVMe and DRAM budgets (a chunk on NVMe is often in DRAM as well).
  uint64_t CapacityBytes() override;
  void Expedite(const ChunkKey& key) override { upstream_->Expedite(key); }
  bool FetchesBlockRanges() override { return upstream_->FetchesBlockRanges(); }
  bool BatchesBlockRanges() override { return upstream_->BatchesBlockRanges(); }
  void Shutdown() override { upstream_->Shutdown(); }

  // Run-time changes (SIGHUP). Shrinking evicts at once while serving. Changing the NVMe size
  // of a cache opened with size 0 is not possible (FailedPrecondition): that needs a restart.
  Status SetSizeBytes(uint64_t size_bytes);
  void SetMemoryBytes(uint64_t memory_bytes);
  // Drops every cached chunk of every version of `dataset` this process has seen (and the
  // upstream's current version, when reachable).
  Status Evict(const std::string& dataset);
  // Waits until every fetched chunk queued for NVMe is written and committed (tests, warm).
  void Flush();

  // Future access order for the clairvoyant policy (see access_plan.h).
  AccessPlan& access_plan() { return plan_; }
  void SetFutureAccessOrder(std::string_view version, uint64_t base_position,
                            std::span<const ChunkRef> order) {
    plan_.SetFutureAccessOrder(version, base_position, order);
  }

  CacheStats Stats() const;
  // The served/hit/miss counters and the DRAM tier's gauges, for /metrics (cache_metrics.h);
  // the NVMe tier reports its own.
  void VisitStats(const stats::Visitor& visit) const override;
  // Why the NVMe tier's disk is failing (disk_health.h); "" when it is not, or there is none.
  std::string disk_problem() const { return store_ ? store_->disk_problem() : std::string(); }
  ChunkSource& upstream() { return *upstream_; }

 private:
  enum class Tier { kNone, kDram, kNvme, kUpstream };
  CachedSource(const CacheOptions& options, std::unique_ptr<ChunkSource> upstream);
  // DRAM → write queue → NVMe for one chunk; nullptr on a miss.
  ChunkPtr FindCached(const ChunkKey& key, uint64_t length, const Hash128& hash, Tier* tier);
  // The chunk in DRAM or in the NVMe write queue; nullptr otherwise.
  ChunkPtr InMemory(const ChunkKey& key);
  // A piece's bytes held in memory: from `at` of `bytes`, its whole chunk or a run of exactly
  // this piece.
  struct HeldPiece {
    ChunkPtr bytes;  // nullptr: neither is in memory
    uint64_t at = 0;
    bool run = false;
  };
  HeldPiece PieceInMemory(const ChunkKey& key, const ChunkPiece& piece);
  // Copies one piece from memory and counts a DRAM hit (and a run hit).
  void CopyFromMemory(const ChunkPiece& piece, const HeldPiece& held, const ChunkKey& key, bool demand);
  // The runs of `pieces` the NVMe tier holds, verified, copied to their dests and put in DRAM;
  // the pieces it does not hold are appended to `missing`.
  void ReadRunsFromDisk(const Hash128& vid, uint32_t shard, std::span<const ChunkPiece> pieces, bool demand,
                        std::vector<ChunkPiece>* missing);
  // ReadPieces with keep_only: the pieces no tier holds, fetched as runs (FetchRuns).
  Status KeepPieces(const DatasetPtr& dataset, uint32_t shard, std::span<const ChunkPiece> pieces,
                    const ReadOptions& options);
  // Fetches the blocks covering each of `missing` from upstream into a new run, kept as it
  // lands (KeepRun) and copied to the piece's dest when it has one; options.piece_done hears
  // caller_index[i] for missing[i].
  Status FetchRuns(const DatasetPtr& dataset, uint32_t shard, std::span<const ChunkPiece> missing,
                   std::span<const size_t> caller_index, const ReadOptions& options);
  // Keeps a sealed run in DRAM and, when the write queue has room at once, on NVMe.
  void KeepRun(const ChunkKey& key, ChunkPtr run);
  // Some tier holds the chunk (no LRU refresh, no I/O).
  bool Held(const ChunkKey& key) const;
  // Some tier holds the piece of chunk `key`: its whole chunk, or a run of exactly this piece.
  bool PieceHeld(const ChunkKey& key, const ChunkPiece& piece) const;
  void Account(Tier tier, uint64_t bytes);
  using Flight = upstream::SingleFlight<ChunkKey, Result<ChunkPtr>, ChunkKeyHash>::Flight;
  struct Slot;
  // Chunks [from, to) of a shard as the tiers hold them (DRAM, write queue, NVMe in one
  // io_uring batch); a slot without a chunk is a miss.
  std::vector<Slot> LookUp(const DatasetPtr& dataset, uint32_t shard, uint64_t from, uint64_t to);
  // Extends the run of misses led by this caller (run->front() is slot i's flight) over the
  // following slots it can lead too; returns the slot after the run.
  size_t ExtendRun(std::vector<Slot>& slots, size_t i, std::vector<Flight>* run);
  // Fetches the run (chunks from run_first, slots run_slots[0..run.size())) from upstream,
  // verifying, storing, publishing to the run's followers and delivering each to `sink`.
  Status FetchRun(const DatasetPtr& dataset, uint32_t shard, uint64_t run_first, Slot* run_slots,
                  std::vector<Flight>& run, const ReadOptions& options, const ChunkSink& sink);
  void RememberVersion(const std::string& name, const std::string& version) REQUIRES(mu_);

  const CacheOptions options_;
  const std::unique_ptr<ChunkSource> upstream_;
  AccessPlan plan_;                          // before store_: the store's policy refers to it
  DramCache dram_;
  std::unique_ptr<NvmeStore> store_;         // null when size_bytes == 0
  upstream::SingleFlight<ChunkKey, Result<ChunkPtr>, ChunkKeyHash> flights_;  // per chunk

  mutable Mutex mu_;
  std::map<std::string, DatasetPtr> datasets_ GUARDED_BY(mu_);             // last manifest per name
  std::multimap<std::string, std::string> versions_seen_ GUARDED_BY(mu_);  // name → version

  std::atomic<uint64_t> served_dram_{0}, served_nvme_{0}, served_upstream_{0}, hits_dram_{0},
      hits_nvme_{0}, misses_{0}, fetched_{0}, upstream_calls_{0}, joined_{0}, runs_kept_{0}, run_hits_{0};
  metrics::SourceHandle stats_source_;  // last: leaves the Registry before the figures above go
};

}  // namespace shardcache::cache
