#include "daemon/serve/loader_pipeline.h"
#include "common/thread_name.h"

#include <algorithm>
#include <tuple>

namespace shardcache::serve {
namespace {

// How long the pipeline thread sleeps before re-checking for stop when nothing is to do.
constexpr auto kIdlePoll = std::chrono::milliseconds(50);

uint64_t MicrosSince(std::chrono::steady_clock::time_point t0) {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - t0).count());
}

// Longest run of chunks one warm read asks for (the upstream splits it over its streams).
constexpr uint64_t kMaxWarmRunChunks = 64;
// lookahead_in_flight_only: chunks tracked ahead of assembly at most (~100 bytes each).
constexpr size_t kMaxWarmTrackedChunks = 65536;
// Samples ahead of the warm walk whose shards' sample indexes are loaded in one parallel go.
constexpr size_t kWarmIndexWindow = 4096;

}  // namespace

LoaderPipeline::LoaderPipeline(uint64_t id, Arena& arena, BatchAssembler& assembler,
                               std::shared_ptr<SampleLocator> locator, plan::RankSlice slice,
                               LoaderPipelineOptions options, std::unique_ptr<batch_ring::RingWriter> ring)
    : id_(id),
      arena_(arena),
      assembler_(assembler),
      locator_(std::move(locator)),
      version_id_(VersionId(locator_->dataset()->version)),
      slice_(std::move(slice)),
      options_(std::move(options)),
      batch_size_(slice_.options().batch_size),
      total_(slice_.size()),
      ring_(std::move(ring)),
      // For `shardctl top`: which dataset and rank is slow, and whether it waits on data.
      series_(ForLoader(locator_->dataset()->name, slice_.options().rank)) {
  series_.open->Add(1);
  if (options_.warm_samples && options_.lookahead_in_flight_only) {
    sample_warmer_ = std::make_unique<SampleWarmer>(assembler_, *locator_, slice_, assembled_from_);
  }
  thread_ = std::thread([this] {
    NameThisThread("sc-loader");
    Run();
  });
}

void LoaderPipeline::Cancel() {
  {
    MutexLock l(&mu_);
    stop_ = true;
  }
  cv_.NotifyAll();
  arena_.NotifyAll();
}

LoaderPipeline::~LoaderPipeline() {
  Cancel();
  thread_.join();
  {
    // Assemblies in flight call back into this object; their reads end by the read deadline.
    MutexLock l(&mu_);
    cv_.Wait(&mu_, [&]() REQUIRES(mu_) { return assembling_ == 0; });
  }
  arena_.ReleaseAll(id_);
  series_.open->Add(-1);
}

uint64_t LoaderPipeline::samples_consumed() const {
  MutexLock l(&mu_);
  return slice_.RankConsumedAfter(consumed_);
}

bool LoaderPipeline::CanStartLocked() const {
  // Every batch started and not yet delivered holds a slot: queued, assembling, assembled but
  // waiting for an earlier one, or cancelled and waiting for its reads to end. Counting only
  // the running assemblies let a slow batch pile up finished ones behind it until the arena
  // was full and the client's other loaders got no slot.
  const size_t queued = ready_.size() + inflight_.size();
  const bool first_alone = next_assembly_ > 0 && !first_assembled_;
  return error_.ok() && !first_alone && assemble_index_ < total_ && queued < options_.prefetch_batches &&
         assembling_ < std::max<uint32_t>(1, options_.assemble_depth) &&
         queued + arena_.SlotsIn(Arena::SlotState::kDelivered, id_) < options_.max_slots;
}

void LoaderPipeline::Run() {
  for (;;) {
    std::optional<uint32_t> slot;
    uint64_t first = 0, count = 0, seq = 0;
    bool want_slot = false;
    {
      MutexLock l(&mu_);
      if (stop_) return;
      if (CanStartLocked()) {
        want_slot = true;
        slot = arena_.TryAcquire(id_);
        if (slot) {
          first = assemble_index_;
          count = std::min<uint64_t>(batch_size_, total_ - assemble_index_);
          assemble_index_ += count;
          assembled_from_->store(assemble_index_);
          seq = next_assembly_++;
          ++assembling_;
          inflight_.emplace(seq, InFlight{*slot, first, count, false, false, {}});
          order_.push_back(seq);
        }
      }
    }
    // Neither call blocks: the batch's demand reads are queued first (the upstream serves them
    // before prefetches), then the warm reads ahead of it — every pass, so that a trainer
    // waiting on every batch never starves the fetches that would end its waiting.
    if (slot) StartAssembly(seq, *slot, first, count);
    const bool warmed = Warm();
    if (slot || warmed) continue;
    if (want_slot) {
      arena_.WaitForFree(std::chrono::steady_clock::now() + kIdlePoll);
    } else {
      MutexLock l(&mu_);
      cv_.WaitFor(&mu_, kIdlePoll, [&]() REQUIRES(mu_) { return stop_ || CanStartLocked(); });
    }
  }
}

void LoaderPipeline::StartAssembly(uint64_t seq, uint32_t slot, uint64_t first, uint64_t count) {
  std::vector<uint64_t> ids(count);
  for (uint64_t i = 0; i < count; ++i) ids[i] = slice_.SampleAt(first + i);
  const auto t0 = std::chrono::steady_clock::now();
  assembler_.AssembleAsync(*locator_, std::move(ids), arena_.SlotData(slot), arena_.slot_bytes(),
                           [this, seq, t0](Status s, AssembledBatch batch) {
                             ServeMetrics::Get().batch_assembly_seconds->Observe(std::chrono::duration<double>(
                                                              std::chrono::steady_clock::now() - t0)
                                                              .count());
                             OnAssembled(seq, std::move(s), std::move(batch));
                           },
                           options_.fields,
                           options_.whole_chunks && !sample_warmer_ && seq >= options_.blocks_first_batches);
}

void LoaderPipeline::OnAssembled(uint64_t seq, Status s, AssembledBatch batch) {
  MutexLock l(&mu_);
  --assembling_;
  first_assembled_ = true;
  auto it = inflight_.find(seq);
  InFlight& f = it->second;
  if (stop_) {
    // Stopping: this batch is dropped, and so nothing after it may be delivered either. (The
    // batches behind it that are done would otherwise go out now, one batch out of plan order,
    // into a ring the client still reads: a trainer that then resumes on a successor daemon
    // from its count of batches taken would repeat one batch and never see another.)
    if (!f.cancelled) order_.erase(std::find(order_.begin(), order_.end(), seq));
    (void)arena_.Release(f.slot, id_);
    inflight_.erase(it);
    cv_.NotifyAll();
    return;
  }
  if (f.cancelled) {
    // No longer in order_: a read error before it made it and everything after it obsolete.
    (void)arena_.Release(f.slot, id_);
    inflight_.erase(it);
  } else if (!s.ok()) {
    // Nothing from this batch on is delivered: it and every later one are assembled again,
    // from this batch's first sample, after Next() reported the error.
    (void)arena_.Release(f.slot, id_);
    assemble_index_ = f.first;
    assembled_from_->store(assemble_index_);
    inflight_.erase(it);
    auto pos = std::find(order_.begin(), order_.end(), seq);
    for (auto later = std::next(pos); later != order_.end(); ++later) {
      InFlight& g = inflight_.at(*later);
      if (g.done) {
        (void)arena_.Release(g.slot, id_);
        inflight_.erase(*later);
      } else {
        g.cancelled = true;  // released when its reads finish
      }
    }
    order_.erase(pos, order_.end());
    error_ = s;
  } else {
    f.done = true;
    f.batch = std::move(batch);
  }
  // Batches are handed out in plan order, whichever finished first.
  while (!order_.empty() && inflight_.at(order_.front()).done) {
    auto node = inflight_.extract(order_.front());
    order_.pop_front();
    Delivered d;
    d.slot = node.mapped().slot;
    d.seq = next_seq_++;
    d.batch = std::move(node.mapped().batch);
    ready_.push_back(std::move(d));
  }
  PublishLocked();
  cv_.NotifyAll();
}

void LoaderPipeline::PublishLocked() {
  if (!ring_) return;
  while (!ready_.empty() && arena_.SlotsIn(Arena::SlotState::kDelivered, id_) < ring_->entries()) {
    Delivered& d = ready_.front();
    arena_.MarkDelivered(d.slot);
    consumed_ += d.batch.sample_ids.size();
    const AssembledBatch& b = d.batch;
    ring_->Publish({.slot = d.slot,
                    .payload_bytes = b.payload_bytes,
                    .batch_seq = d.seq,
                    .rank_consumed = slice_.RankConsumedAfter(consumed_),
                    .fields_offset = b.fields_offset,
                    .fields_bytes = b.fields_bytes},
                   b.sample_ids, b.offsets, b.lengths);
    CountDelivered(d);
    ready_.pop_front();
  }
}

void LoaderPipeline::OnReleased() {
  MutexLock l(&mu_);
  PublishLocked();
  cv_.NotifyAll();  // ready_ shrank: the pipeline thread may start the next batch
}

void LoaderPipeline::CountDelivered(const Delivered& d) {
  // Once, in the pair's series: the node's totals are their sums (serve_metrics.h).
  series_.batches->Add();
  series_.bytes->Add(d.batch.payload_bytes);
}

void LoaderPipeline::CountWait(uint64_t wait_us) {
  const ServeMetrics& m = ServeMetrics::Get();
  m.next_wait_seconds->Observe(wait_us / 1e6);
  series_.stall_us->Add(wait_us);
}

Status LoaderPipeline::BlockedLocked(bool ring_full) {
  if (!error_.ok()) {
    Status s = error_;
    error_ = Status::Ok();
    cv_.NotifyAll();
    return s;
  }
  if (consumed_ >= total_) return Status::Ok();  // the caller reports the end of the epoch
  if (ring_full) {
    return ResourceExhausted("the client holds " + std::to_string(ring_->entries()) + " batches of loader " +
                             std::to_string(id_) + ", as many as its batch ring describes; release a batch "
                             "before asking for the next");
  }
  // Only the client can free a slot it holds: when it holds them all, waiting cannot help.
  // Slots in other loaders' queues come back as the client reads those loaders, so then the
  // batch waits (up to the deadline) like any other.
  if (inflight_.empty() && arena_.DeliveredSlots() == arena_.slot_count()) {
    return ResourceExhausted("all " + std::to_string(arena_.slot_count()) +
                             " arena slots are held by this client's unreleased batches; release a "
                             "batch before asking for the next");
  }
  return Status::Ok();
}

bool LoaderPipeline::Warm() {
  const uint64_t lookahead = options_.lookahead_bytes_live
                                 ? options_.lookahead_bytes_live->load(std::memory_order_relaxed)
                                 : options_.lookahead_bytes;
  if (lookahead == 0 || !options_.whole_chunks) return false;
  uint64_t base;
  {
    MutexLock l(&mu_);
    if (!first_assembled_) return false;
    base = assemble_index_;
  }
  if (sample_warmer_) {
    LoadIndexesAhead(std::max(base, sample_warmer_->next()));
    return sample_warmer_->Warm(base, lookahead);
  }
  ReleaseWarmed(base);
  // Samples before `base` are in batches being assembled or queued: their reads are running.
  // The lookahead starts right after them, so assembly plus warm reads never hold more than
  // those batches and `lookahead` bytes of chunks (a small cache is not flushed by its own
  // prefetches).
  // The batches read blocks-first fetched no whole chunks: theirs are warmed from the start.
  if (base > uint64_t{options_.blocks_first_batches} * batch_size_) warm_index_ = std::max(warm_index_, base);
  // Runs built earlier that the pool had no room for go first, in order.
  bool progress = false;
  while (!unsent_.empty()) {
    const WarmRun& r = unsent_.front();
    if (!SendWarm(r)) return progress;
    unsent_.pop_front();
    progress = true;
  }
  // The chunks the plan needs next, within the lookahead; sorted into runs of consecutive
  // chunks so that each becomes one upstream range (many streams at once), not one stream per
  // chunk.
  const auto& m = locator_->dataset()->manifest;
  const uint64_t cb = m.chunk_bytes();
  std::vector<std::tuple<uint32_t, uint64_t, uint64_t>> wanted;  // shard, chunk, needed at
  const size_t max_tracked = options_.lookahead_in_flight_only ? kMaxWarmTrackedChunks : SIZE_MAX;
  LoadIndexesAhead(warm_index_);
  while (warm_index_ < total_ && warmed_bytes_ + cb <= lookahead && warmed_.size() < max_tracked) {
    auto e = locator_->Locate(slice_.SampleAt(warm_index_));
    if (!e.ok()) break;  // the demand path reports it
    if (e->length > 0) {
      for (uint64_t c = e->offset / cb; c <= (e->offset + e->length - 1) / cb; ++c) {
        if (!warmed_keys_.insert(ChunkKey{version_id_, e->shard, c}).second) continue;
        const uint64_t bytes = dataset::ChunkLength(m, e->shard, c);
        warmed_.push_back({warm_index_, e->shard, c, bytes});
        if (options_.lookahead_in_flight_only) unlanded_.push_back(warmed_.back());
        warmed_bytes_ += bytes;
        wanted.emplace_back(e->shard, c, warm_index_);
      }
    }
    ++warm_index_;
  }
  std::sort(wanted.begin(), wanted.end());
  for (const auto& [shard, chunk, needed_at] : wanted) {
    if (!unsent_.empty() && unsent_.back().shard == shard &&
        unsent_.back().first + unsent_.back().count == chunk && unsent_.back().count < kMaxWarmRunChunks) {
      ++unsent_.back().count;
      unsent_.back().last_needed_at = std::max(unsent_.back().last_needed_at, needed_at);
    } else {
      unsent_.push_back({shard, chunk, 1, needed_at});
    }
  }
  while (!unsent_.empty()) {
    const WarmRun& r = unsent_.front();
    if (!SendWarm(r)) break;
    unsent_.pop_front();
    progress = true;
  }
  return progress;
}

void LoaderPipeline::LoadIndexesAhead(uint64_t from) {
  // An error is the demand path's to report.
  if (locator_->record_bytes() != 0 || indexes_loaded_to_ > from) return;
  std::vector<uint64_t> ahead;
  for (uint64_t i = from; i < total_ && ahead.size() < kWarmIndexWindow; ++i) ahead.push_back(slice_.SampleAt(i));
  (void)locator_->LoadIndexesOf(ahead);
  indexes_loaded_to_ = from + ahead.size();
}

void LoaderPipeline::ReleaseWarmed(uint64_t base) {
  const bool bounded = !options_.lookahead_in_flight_only;
  while (!warmed_.empty() && warmed_.front().index < base) {
    if (bounded) warmed_bytes_ -= warmed_.front().bytes;
    warmed_keys_.erase(ChunkKey{version_id_, warmed_.front().shard, warmed_.front().chunk});
    warmed_.pop_front();
  }
  if (bounded) return;
  const DatasetPtr& ds = locator_->dataset();
  auto landed = [&](const Warmed& w) {
    return w.index < base || assembler_.source().Holds(ds, w.shard, w.chunk, 1);
  };
  auto keep = std::remove_if(unlanded_.begin(), unlanded_.end(), [&](const Warmed& w) {
    if (!landed(w)) return false;
    warmed_bytes_ -= w.bytes;
    return true;
  });
  unlanded_.erase(keep, unlanded_.end());
}

bool LoaderPipeline::SendWarm(const WarmRun& r) {
  // A warm read that waited in the pool until assembly passed every sample needing its chunks
  // is dropped: the batches read them already, and fetching them again for nobody could evict
  // chunks that are still needed from a small cache.
  return assembler_.TryWarm(locator_->dataset(), r.shard, r.first, r.count,
                            [from = assembled_from_, last = r.last_needed_at] { return from->load() <= last; });
}

Result<LoaderPipeline::Delivered> LoaderPipeline::Next(std::chrono::steady_clock::time_point deadline,
                                                       const ClientGone& gone) {
  const auto t0 = std::chrono::steady_clock::now();
  MutexLock l(&mu_);
  if (ring_) return FailedPrecondition("loader " + std::to_string(id_) + " delivers through its batch ring");
  for (;;) {
    if (stop_) return Cancelled("loader " + std::to_string(id_) + " was closed");
    if (!ready_.empty()) {
      Delivered d = std::move(ready_.front());
      ready_.pop_front();
      arena_.MarkDelivered(d.slot);
      consumed_ += d.batch.sample_ids.size();
      d.wait_us = MicrosSince(t0);
      l.Unlock();
      cv_.NotifyAll();
      CountDelivered(d);
      CountWait(d.wait_us);
      return d;
    }
    SC_RETURN_IF_ERROR(BlockedLocked(/*ring_full=*/false));
    if (consumed_ >= total_) {
      Delivered d;
      d.end_of_epoch = true;
      return d;
    }
    if (std::chrono::steady_clock::now() >= deadline) return NotReadyLocked();
    SC_RETURN_IF_ERROR(WaitLocked(deadline, gone));
  }
}

Result<LoaderPipeline::RingWait> LoaderPipeline::WaitPublished(uint64_t index,
                                                                std::chrono::steady_clock::time_point deadline,
                                                                const ClientGone& gone) {
  const auto t0 = std::chrono::steady_clock::now();
  MutexLock l(&mu_);
  if (!ring_) return FailedPrecondition("loader " + std::to_string(id_) + " has no batch ring");
  if (index > ring_->published()) {
    return InvalidArgument("batch ring entry " + std::to_string(index) + " of loader " + std::to_string(id_) +
                           " asked for while " + std::to_string(ring_->published()) +
                           " are published; entries are taken in order");
  }
  for (;;) {
    if (stop_) return Cancelled("loader " + std::to_string(id_) + " was closed");
    if (ring_->published() > index) {
      RingWait w;
      w.published = ring_->published();
      w.wait_us = MicrosSince(t0);
      l.Unlock();
      CountWait(w.wait_us);
      return w;
    }
    SC_RETURN_IF_ERROR(BlockedLocked(arena_.SlotsIn(Arena::SlotState::kDelivered, id_) >= ring_->entries()));
    if (consumed_ >= total_) {
      RingWait w;
      w.end_of_epoch = true;
      w.published = ring_->published();
      return w;
    }
    if (std::chrono::steady_clock::now() >= deadline) return NotReadyLocked();
    SC_RETURN_IF_ERROR(WaitLocked(deadline, gone));
  }
}

Status LoaderPipeline::WaitLocked(std::chrono::steady_clock::time_point deadline, const ClientGone& gone) {
  // Bounded waits: a slot freed elsewhere wakes the arena's waiters, not this cv, and a client
  // that went away wakes nobody.
  cv_.WaitUntil(&mu_, std::min(deadline, std::chrono::steady_clock::now() + kIdlePoll));
  if (gone && gone()) return Cancelled("the client of loader " + std::to_string(id_) + " went away while it waited");
  return Status::Ok();
}

Status LoaderPipeline::NotReadyLocked() const {
  std::string why;
  if (inflight_.empty() && arena_.FreeSlots() == 0) {
    why = ": no arena slot is free (" + std::to_string(arena_.DeliveredSlots()) + " of " +
          std::to_string(arena_.slot_count()) +
          " held by this client's batches, the rest by its other loaders' prefetched batches)";
  }
  return DeadlineExceeded("next batch of loader " + std::to_string(id_) + " not ready in time" + why);
}

}  // namespace shardcache::serve
