// LoaderFactory: turns an OpenLoader request into a started LoaderPipeline (loader_pipeline.h).
//
// Open() checks the request field by field (loader_request.h: InvalidArgument naming the field
// and its value), opens the dataset, checks the loader's expected version and that a batch of
// fixed-size records fits an arena slot, builds or shares the loader's EpochPlan and
// SampleLocator, sizes its batch ring (RingEntriesFor), faults in the fronts of the arena slots
// its batches fill (kOpenPrefaultBytes), starts the pipeline and notes it to the access-order
// reporter. Whatever is wrong comes back as a Status that says what.
//
// Sharing: loaders with equal plan parameters (dataset version, seed, epoch, mode, window as
// resolved: PlanKey) share one EpochPlan, whatever their world size, batch size or worker, and
// loaders of one dataset version share one SampleLocator. The factory keeps them only while a
// loader holds them (weak references). Chunk reads go to the ChunkSource, whose cache tier
// single-flights them, so the ranks of one job on one node fetch each chunk once. All loaders
// share the factory's BatchAssembler (its reader pool).
//
// Thread safety: Open() and the lookahead setter from any thread (the plan and locator caches
// are guarded by mu_; a plan is built outside it). The pipelines Open() returns use the
// factory's assembler and lookahead: the factory must outlive them.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "common/mutex.h"
#include "common/status.h"
#include "daemon/plan/epoch_plan.h"
#include "daemon/serve/arena.h"
#include "daemon/serve/batch_assembler.h"
#include "daemon/serve/loader_pipeline.h"
#include "daemon/serve/serve_defaults.h"
#include "daemon/source/chunk_source.h"

namespace shardcache::v1 {
class OpenLoaderRequest;
}

namespace shardcache::serve {

class AccessOrderReporter;

// Batches a loader's batch ring describes at once, at most half the arena's slots (the rest
// stay for the pipeline's prefetch_batches and the client's other loaders). The batches the
// client has read ahead, holds, or released without telling the daemon yet all count against
// it. The deeper the ring, the longer a daemon thread may be late (descheduled, a page fault,
// a slow read) before the trainer notices: 64 batches of a few hundred microseconds each ride
// out a 10-20 ms hiccup, 12 did not (bench/run latency on a 2-core VM).
constexpr uint32_t kRingEntries = 64;
// Ring entries for a loader that may hold max_slots slots: min(kRingEntries, max_slots), fewer
// when batches of batch_size samples would make the ring larger than batch_ring::kMaxRingBytes;
// at least 1.
uint32_t RingEntriesFor(uint32_t max_slots, uint32_t batch_size);
// OpenLoader faults in the front of every arena slot that the loader's batches fill (see
// Arena::PrefaultFronts), up to this much of the arena in all.
constexpr uint64_t kOpenPrefaultBytes = 256ull << 20;

// The plan parameters loaders share a plan by: dataset version, seed, epoch, mode and the block
// window as resolved (plans of different world sizes with the same window are one order).
std::string PlanKey(const DatasetPtr& dataset, const plan::PlanOptions& o);

struct LoaderFactoryOptions {
  // Per loader: batches assembled ahead and chunk bytes warmed ahead of those (0 = none); see
  // LocalServiceOptions.
  uint32_t prefetch_batches = 4;
  uint64_t prefetch_lookahead_bytes = kDefaultLookaheadBytes;
  BatchAssemblerOptions assembler;
};

// A started loader and the dataset version it reads.
struct OpenedLoader {
  std::unique_ptr<LoaderPipeline> pipeline;
  DatasetPtr dataset;
};

class LoaderFactory {
 public:
  // `reporter` (optional) is told of every loader opened; it must outlive the factory.
  LoaderFactory(ChunkSource& source, LoaderFactoryOptions options, AccessOrderReporter* reporter = nullptr);
  LoaderFactory(const LoaderFactory&) = delete;
  LoaderFactory& operator=(const LoaderFactory&) = delete;

  // A loader of `request` (from a client that said `protocol_version` in its Hello) writing into
  // `arena`, started, with the next loader id (ids are unique over the factory's life; a refused
  // request takes none). InvalidArgument for a bad field; the dataset's errors
  // (NotFound...); FailedPrecondition when the dataset is not at request.expect_version;
  // ResourceExhausted when a batch cannot fit an arena slot.
  Result<OpenedLoader> Open(Arena& arena, const v1::OpenLoaderRequest& request,
                            uint32_t protocol_version);

  // Changes the warm-read lookahead of every loader, open or future (SIGHUP reload).
  void SetPrefetchLookaheadBytes(uint64_t bytes) { lookahead_bytes_.store(bytes); }
  uint64_t prefetch_lookahead_bytes() const { return lookahead_bytes_.load(); }

 private:
  Result<std::shared_ptr<SampleLocator>> LocatorFor(const DatasetPtr& dataset);
  Result<std::shared_ptr<const plan::EpochPlan>> PlanFor(const DatasetPtr& dataset, const plan::PlanOptions& o);

  ChunkSource& source_;
  const LoaderFactoryOptions options_;
  AccessOrderReporter* const reporter_;
  BatchAssembler assembler_;
  std::atomic<uint64_t> next_loader_id_{1};
  std::atomic<uint64_t> lookahead_bytes_;

  Mutex mu_;
  std::map<std::string, std::weak_ptr<SampleLocator>> locators_ GUARDED_BY(mu_);  // by dataset version
  std::map<std::string, std::weak_ptr<const plan::EpochPlan>> plans_ GUARDED_BY(mu_);  // by PlanKey
};

}  // namespace shardcache::serve
