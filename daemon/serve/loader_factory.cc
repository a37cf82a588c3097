#include "daemon/serve/loader_factory.h"

#include <algorithm>

#include "daemon/serve/access_order_reporter.h"
#include "daemon/serve/loader_request.h"
#include "shardcache/batch_ring.h"
#include "shardcache/local.pb.h"

namespace shardcache::serve {
namespace {

// The bytes a batch of `batch_size` samples fills (records: exactly; other formats: the average
// sample, with a quarter more for the spread), at most a slot. (In floating point: a hostile
// batch_size must not overflow it; the slot caps it.)
uint64_t BatchBytesToPrefault(const v1::Manifest& m, uint64_t record_bytes, uint32_t batch_size,
                              uint64_t slot_bytes) {
  const double batch_bytes =
      record_bytes > 0 ? double(record_bytes) * batch_size
                       : double(m.total_bytes()) / double(std::max<uint64_t>(1, m.total_samples())) * batch_size * 1.25;
  return static_cast<uint64_t>(std::min(batch_bytes, double(slot_bytes)));
}

}  // namespace

uint32_t RingEntriesFor(uint32_t max_slots, uint32_t batch_size) {
  uint32_t entries = std::max(1u, std::min(max_slots, kRingEntries));
  while (entries > 1 && batch_ring::RingBytes(entries, batch_size) > batch_ring::kMaxRingBytes) entries /= 2;
  return entries;
}

std::string PlanKey(const DatasetPtr& dataset, const plan::PlanOptions& o) {
  return dataset->version + "/" + std::to_string(o.seed) + "/" + std::to_string(o.epoch) + "/" +
         plan::ShuffleModeName(o.mode) + "/" +
         std::to_string(plan::ResolveBlockWindow(plan::LayoutOf(*dataset), o));
}

LoaderFactory::LoaderFactory(ChunkSource& source, LoaderFactoryOptions options, AccessOrderReporter* reporter)
    : source_(source),
      options_(std::move(options)),
      reporter_(reporter),
      assembler_(source, options_.assembler),
      lookahead_bytes_(options_.prefetch_lookahead_bytes) {}

Result<OpenedLoader> LoaderFactory::Open(Arena& arena, const v1::OpenLoaderRequest& request,
                                         uint32_t protocol_version) {
  SC_ASSIGN_OR_RETURN(LoaderRequest o, CheckOpenLoader(request, protocol_version));
  SC_ASSIGN_OR_RETURN(DatasetPtr ds, source_.OpenDataset(o.dataset));
  if (!o.expect_version.empty() && o.expect_version != ds->version) {
    return FailedPrecondition("dataset '" + o.dataset + "' is at version " + ds->version +
                              ", but the loader resumes a state of version " + o.expect_version +
                              " (the dataset was re-indexed since the state was saved)");
  }
  const auto& m = ds->manifest;
  const uint64_t record_bytes = m.format() == v1::RECORDS ? m.record_bytes() : 0;
  const uint32_t batch_size = o.slice.batch_size;
  if (record_bytes > 0 && record_bytes * batch_size > arena.slot_bytes()) {
    return ResourceExhausted("a batch of " + std::to_string(batch_size) + " records of " +
                             std::to_string(record_bytes) + " bytes does not fit a " +
                             std::to_string(arena.slot_bytes()) + "-byte arena slot");
  }
  SC_ASSIGN_OR_RETURN(auto plan, PlanFor(ds, o.plan));
  SC_ASSIGN_OR_RETURN(plan::RankSlice slice, plan::RankSlice::Make(plan, o.slice));
  SC_ASSIGN_OR_RETURN(auto locator, LocatorFor(ds));
  LoaderPipelineOptions lo;
  lo.prefetch_batches = options_.prefetch_batches;
  lo.lookahead_bytes_live = &lookahead_bytes_;
  // Warm reads may run ahead of slow chunks only when fetching ahead cannot push out chunks
  // this epoch still needs.
  uint64_t dataset_bytes = 0;
  for (const auto& shard : m.shards()) dataset_bytes += shard.size_bytes();
  const bool fits = dataset_bytes <= source_.CapacityBytes();
  lo.lookahead_in_flight_only = fits;
  lo.whole_chunks = fits || o.plan.mode != plan::ShuffleMode::kGlobal;
  lo.blocks_first_batches = lo.whole_chunks && source_.FetchesBlockRanges() ? std::max(1u, lo.prefetch_batches) : 0;
  // A global shuffle warms sample by sample where small ranges are cheap (measured through a
  // bucket, a GET per sample: 0.66 x rclone against 0.90 with whole chunks).
  lo.warm_samples = fits && o.plan.mode == plan::ShuffleMode::kGlobal && source_.BatchesBlockRanges();
  lo.fields = o.fields;
  std::unique_ptr<batch_ring::RingWriter> ring;
  if (o.ring) {
    // A ring loader holds at most half the arena, so a client's second loader always finds
    // slots (loaders of protocol 1-2 clients keep their old, unlimited share).
    lo.max_slots = std::max(1u, arena.slot_count() / 2);
    SC_ASSIGN_OR_RETURN(ring, batch_ring::RingWriter::Create(RingEntriesFor(lo.max_slots, batch_size), batch_size));
  }
  // Faulted in before the first batch is assembled.
  arena.PrefaultFronts(BatchBytesToPrefault(m, record_bytes, batch_size, arena.slot_bytes()), kOpenPrefaultBytes);
  const uint64_t id = next_loader_id_++;
  auto pipe = std::make_unique<LoaderPipeline>(id, arena, assembler_, locator, slice, lo, std::move(ring));
  if (reporter_) reporter_->NoteLoader(ds, locator, slice);
  return OpenedLoader{std::move(pipe), std::move(ds)};
}

Result<std::shared_ptr<SampleLocator>> LoaderFactory::LocatorFor(const DatasetPtr& dataset) {
  MutexLock l(&mu_);
  auto& w = locators_[dataset->version];
  if (auto p = w.lock()) return p;
  auto p = std::make_shared<SampleLocator>(source_, dataset);
  w = p;
  return p;
}

Result<std::shared_ptr<const plan::EpochPlan>> LoaderFactory::PlanFor(const DatasetPtr& dataset,
                                                                      const plan::PlanOptions& o) {
  const std::string key = PlanKey(dataset, o);
  {
    MutexLock l(&mu_);
    for (auto it = plans_.begin(); it != plans_.end();) {
      it = it->second.expired() ? plans_.erase(it) : std::next(it);
    }
    if (auto it = plans_.find(key); it != plans_.end()) {
      if (auto p = it->second.lock()) return p;
    }
  }
  // Built outside the lock: a plan of millions of samples takes a moment.
  SC_ASSIGN_OR_RETURN(auto p, plan::EpochPlan::Make(plan::LayoutOf(*dataset), o));
  MutexLock l(&mu_);
  if (auto it = plans_.find(key); it != plans_.end()) {
    if (auto existing = it->second.lock()) return existing;
  }
  plans_[key] = p;
  return p;
}

}  // namespace shardcache::serve
