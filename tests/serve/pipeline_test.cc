// LoaderPipeline on its own: two batches assembled at once, finishing in any order, are still
// delivered in plan order; a read error is reported once and the pipeline resumes at the
// failed batch, so the trainer sees every sample of the epoch exactly once, in order. A slow
// batch does not let the ones behind it take more than prefetch_batches slots, and a loader
// whose client's other loaders hold every slot waits for one instead of failing. With a batch
// ring, the same holds for batches published into it, and no more than its entries are held.
#include <catch2/catch.hpp>

#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <optional>
#include <tuple>
#include <set>
#include <span>
#include <utility>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "shardcache/batch_ring.h"
#include "daemon/plan/epoch_plan.h"
#include "daemon/plan/rank_slice.h"
#include "daemon/serve/arena.h"
#include "daemon/serve/batch_assembler.h"
#include "daemon/serve/loader_pipeline.h"
#include "daemon/upstream/file_source.h"
#include "testing/datasets.h"
#include "testing/eventually.h"
#include "testing/temp_dir.h"
#include "testing/forwarding_source.h"
#include "testing/random_delay.h"

namespace shardcache {
namespace {

using serve::LoaderPipeline;

// Sleeps a random 0-2 ms before every read (so assemblies finish out of order) and fails the
// first `failures` reads that touch chunk `bad_chunk` of shard 0 with Unavailable.
class FlakySource final : public testing::ForwardingSource {
 public:
  FlakySource(ChunkSource& inner, uint64_t bad_chunk, int failures)
      : ForwardingSource(inner), bad_chunk_(bad_chunk), failures_left_(failures) {}
  Status ReadChunks(const DatasetPtr& d, uint32_t shard, uint64_t first, uint64_t count,
                    const ReadOptions& o, const ChunkSink& sink) override {
    delay_.Sleep();
    if (shard == 0 && first <= bad_chunk_ && bad_chunk_ < first + count && failures_left_.fetch_sub(1) > 0) {
      failed_.fetch_add(1);
      return Unavailable("injected failure of chunk " + std::to_string(bad_chunk_));
    }
    return inner_.ReadChunks(d, shard, first, count, o, sink);
  }
  std::atomic<int> failed_{0};

 private:
  const uint64_t bad_chunk_;
  std::atomic<int> failures_left_;
  testing::RandomDelay delay_{11, 2000};
};

// Holds every read of shard 0 that starts at chunk `gated` until Open(); counts all reads.
class GatedSource final : public testing::ForwardingSource {
 public:
  GatedSource(ChunkSource& inner, uint64_t gated) : ForwardingSource(inner), gated_(gated) {}
  Status ReadChunks(const DatasetPtr& d, uint32_t shard, uint64_t first, uint64_t count,
                    const ReadOptions& o, const ChunkSink& sink) override {
    reads_.fetch_add(1);
    if (shard == 0 && first == gated_) {
      std::unique_lock<std::mutex> l(mu_);
      ++waiting_;
      cv_.wait(l, [&] { return open_; });
    }
    return inner_.ReadChunks(d, shard, first, count, o, sink);
  }
  void Open() {
    {
      std::lock_guard<std::mutex> l(mu_);
      open_ = true;
    }
    cv_.notify_all();
  }
  int waiting() {
    std::lock_guard<std::mutex> l(mu_);
    return waiting_;
  }
  int reads() const { return reads_.load(); }

 private:
  const uint64_t gated_;
  std::atomic<int> reads_{0};
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = false;
  int waiting_ = 0;
};

// Takes and releases every batch to the end of the epoch, checking that the samples come in plan
// order from `next_sample` on; returns the sample after the last.
uint64_t ReadToEnd(LoaderPipeline& pipeline, serve::Arena& arena, uint64_t loader, uint64_t next_sample) {
  for (;;) {
    auto d = pipeline.Next(std::chrono::steady_clock::now() + std::chrono::seconds(20));
    REQUIRE(d.ok());
    if (d->end_of_epoch) return next_sample;
    for (uint64_t id : d->batch.sample_ids) REQUIRE(id == next_sample++);
    REQUIRE(arena.Release(d->slot, loader).ok());
  }
}

// 4 shards x 256 records of 1 KiB in 16 KiB chunks, and a plan in file order with batches of
// 16: batch k < 64 is exactly shard 0's chunk k. Reads of chunk `gated_chunk` wait at the gate:
// by default batch 1's, since a loader's first batch goes alone (nothing starts behind it
// until it is assembled).
struct GatedFixture {
  explicit GatedFixture(uint64_t gated_chunk = 1) {
    root = tmp.path() + "/data";
    REQUIRE(MakeDirs(root).ok());
    auto ds = testing::MakeRecordsDataset(root, "rec", 4, 256, 1024, 16 * 1024);
    REQUIRE(ds.ok());
    dataset = *ds;
    auto f = upstream::FileSource::Open(root);
    REQUIRE(f.ok());
    files = std::move(*f);
    gated = std::make_unique<GatedSource>(*files, gated_chunk);
    locator = std::make_shared<serve::SampleLocator>(*gated, dataset);
    plan::PlanOptions po;
    po.mode = plan::ShuffleMode::kNone;
    auto p = plan::EpochPlan::Make(plan::LayoutOf(*dataset), po);
    REQUIRE(p.ok());
    plan::SliceOptions so;
    so.batch_size = 16;
    auto sl = plan::RankSlice::Make(*p, so);
    REQUIRE(sl.ok());
    slice = *sl;
    options.prefetch_batches = 4;
    options.assemble_depth = 2;
    options.lookahead_bytes = 0;
  }
  testing::TempDir tmp;
  std::string root;
  dataset::DatasetPtr dataset;
  std::unique_ptr<ChunkSource> files;
  std::unique_ptr<GatedSource> gated;
  std::shared_ptr<serve::SampleLocator> locator;
  std::optional<plan::RankSlice> slice;
  serve::LoaderPipelineOptions options;
};

TEST_CASE("a slow batch does not let the batches behind it take more than prefetch_batches slots",
          "[serve][pipeline]") {
  GatedFixture f;
  auto arena = serve::Arena::Create(2 << 20, 16);
  REQUIRE(arena.ok());
  serve::BatchAssemblerOptions ao;
  ao.read_threads = 4;
  serve::BatchAssembler assembler(*f.gated, ao);
  LoaderPipeline pipeline(3, **arena, assembler, f.locator, *f.slice, f.options);

  // Batch 1 waits at the gate; batches 2.. finish behind it and wait for it in order.
  REQUIRE(testing::Eventually([&] { return f.gated->waiting() > 0; }));
  uint32_t most_taken = 0;
  const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(300);
  while (std::chrono::steady_clock::now() < end) {
    most_taken = std::max(most_taken, 16 - (*arena)->FreeSlots());
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  CHECK(most_taken == f.options.prefetch_batches);
  f.gated->Open();

  uint64_t next_sample = 0;
  for (;;) {
    auto d = pipeline.Next(std::chrono::steady_clock::now() + std::chrono::seconds(20));
    REQUIRE(d.ok());
    if (d->end_of_epoch) break;
    for (uint64_t id : d->batch.sample_ids) REQUIRE(id == next_sample++);
    CHECK(16 - (*arena)->FreeSlots() <= f.options.prefetch_batches + 1);
    REQUIRE((*arena)->Release(d->slot, 3).ok());
  }
  CHECK(next_sample == 1024);
}

TEST_CASE("a loader's first batch goes alone: no other batch and no warm read starts before it is assembled",
          "[serve][pipeline]") {
  // On a cold start the first batch's reads would share the link with the next batches' and the
  // warm reads'; the trainer waits for this one batch.
  GatedFixture f(/*gated_chunk=*/0);
  auto arena = serve::Arena::Create(2 << 20, 16);
  REQUIRE(arena.ok());
  serve::BatchAssemblerOptions ao;
  ao.read_threads = 4;
  serve::BatchAssembler assembler(*f.gated, ao);
  f.options.lookahead_bytes = 8 * 16 * 1024;
  LoaderPipeline pipeline(4, **arena, assembler, f.locator, *f.slice, f.options);
  REQUIRE(testing::Eventually([&] { return f.gated->waiting() > 0; }));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  CHECK(f.gated->reads() == f.gated->waiting());  // batch 0's read only
  CHECK(16 - (*arena)->FreeSlots() == 1);
  f.gated->Open();
  // Then the batches behind it start (batch 0 waits in ready_, so prefetch_batches - 1 of them).
  CHECK(testing::Eventually([&] { return f.gated->reads() >= static_cast<int>(f.options.prefetch_batches); }));
  CHECK(ReadToEnd(pipeline, **arena, 4, 0) == 1024);
}

// A cache tier stand-in: remembers every chunk read through it and holds it from then on.
class HoldingSource final : public testing::ForwardingSource {
 public:
  using ForwardingSource::ForwardingSource;
  Status ReadChunks(const DatasetPtr& d, uint32_t shard, uint64_t first, uint64_t count, const ReadOptions& o,
                    const ChunkSink& sink) override {
    SC_RETURN_IF_ERROR(inner_.ReadChunks(d, shard, first, count, o, sink));
    std::lock_guard<std::mutex> l(mu_);
    for (uint64_t c = first; c < first + count; ++c) held_.insert({shard, c});
    return Status::Ok();
  }
  bool Holds(const DatasetPtr&, uint32_t shard, uint64_t first, uint64_t count) override {
    std::lock_guard<std::mutex> l(mu_);
    for (uint64_t c = first; c < first + count; ++c) {
      if (held_.count({shard, c}) == 0) return false;
    }
    return true;
  }
  size_t held() {
    std::lock_guard<std::mutex> l(mu_);
    return held_.size();
  }

 private:
  std::mutex mu_;
  std::set<std::pair<uint32_t, uint64_t>> held_;
};

TEST_CASE("warm reads run ahead of a stuck chunk when the tiers can keep the dataset, and stop at the lookahead when not",
          "[serve][pipeline]") {
  // Batch 1 (shard 0's chunk 1) is stuck at the gate, so assembly cannot pass it. The lookahead
  // is two 16 KiB chunks. Counting every warmed chunk until assembly passes it, warm reads stop
  // two chunks ahead; counting only chunks not yet held by a tier, they go on through the
  // dataset (64 chunks) while chunk 1 is stuck.
  const bool in_flight_only = GENERATE(false, true);
  GatedFixture f;
  HoldingSource holding(*f.gated);
  auto arena = serve::Arena::Create(2 << 20, 16);
  REQUIRE(arena.ok());
  serve::BatchAssemblerOptions ao;
  ao.read_threads = 8;
  serve::BatchAssembler assembler(holding, ao);
  f.options.lookahead_bytes = 2 * 16 * 1024;
  f.options.lookahead_in_flight_only = in_flight_only;
  LoaderPipeline pipeline(5, **arena, assembler, f.locator, *f.slice, f.options);
  REQUIRE(testing::Eventually([&] { return f.gated->waiting() > 0; }));
  if (in_flight_only) {
    CHECK(testing::Eventually([&] { return holding.held() == 63; }));  // all but the stuck one
  } else {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    INFO("held " << holding.held());
    // Batch 0, batches 2.. of the prefetch window (assembly) and the two chunks warmed past them.
    CHECK(holding.held() <= f.options.prefetch_batches + 2);
  }
  f.gated->Open();
  CHECK(ReadToEnd(pipeline, **arena, 5, 0) == 1024);
}

// A remote that fetches block ranges: pieces-only reads (whole_chunks false) are served from
// the files at once, counted by chunk; whole-chunk reads go through the gate like any other.
class RangeFetchingSource final : public testing::ForwardingSource {
 public:
  RangeFetchingSource(ChunkSource& gated, ChunkSource& files) : ForwardingSource(gated), files_(files) {}
  Status ReadPieces(const DatasetPtr& d, uint32_t shard, std::span<const ChunkPiece> pieces,
                    const ReadOptions& o) override {
    if (o.whole_chunks) return ChunkSource::ReadPieces(d, shard, pieces, o);  // whole, through the gate
    {
      std::lock_guard<std::mutex> l(mu_);
      for (const ChunkPiece& p : pieces) ranged_.insert({shard, p.chunk});
    }
    return files_.ReadPieces(d, shard, pieces, o);
  }
  bool FetchesBlockRanges() override { return true; }
  std::set<std::pair<uint32_t, uint64_t>> ranged() {
    std::lock_guard<std::mutex> l(mu_);
    return ranged_;
  }

 private:
  ChunkSource& files_;
  std::mutex mu_;
  std::set<std::pair<uint32_t, uint64_t>> ranged_;
};

TEST_CASE("the first batches read only their samples' blocks while their chunks arrive whole behind them",
          "[serve][pipeline]") {
  // Whole-chunk reads of batch 2's chunk (shard 0, chunk 2) are stuck at the gate. The first two
  // batches read pieces-only, so they are delivered while batch 2's whole chunk waits; batches
  // from 2 on read whole chunks.
  GatedFixture f(/*gated_chunk=*/2);
  RangeFetchingSource ranges(*f.gated, *f.files);
  auto arena = serve::Arena::Create(2 << 20, 16);
  REQUIRE(arena.ok());
  serve::BatchAssemblerOptions ao;
  ao.read_threads = 8;
  serve::BatchAssembler assembler(ranges, ao);
  f.options.lookahead_bytes = 4 * 16 * 1024;
  f.options.blocks_first_batches = 2;
  f.options.prefetch_batches = 2;
  LoaderPipeline pipeline(6, **arena, assembler, f.locator, *f.slice, f.options);
  for (uint64_t batch = 0; batch < 2; ++batch) {
    auto d = pipeline.Next(std::chrono::steady_clock::now() + std::chrono::seconds(20));
    REQUIRE(d.ok());
    REQUIRE_FALSE(d->end_of_epoch);
    CHECK(d->batch.sample_ids.front() == 16 * batch);
    REQUIRE((*arena)->Release(d->slot, 6).ok());
  }
  CHECK(testing::Eventually([&] { return f.gated->waiting() > 0; }));  // chunk 2 read whole
  f.gated->Open();
  CHECK(ReadToEnd(pipeline, **arena, 6, 32) == 1024);
  using Chunks = std::set<std::pair<uint32_t, uint64_t>>;
  CHECK(ranges.ranged() == Chunks{{0, 0}, {0, 1}});  // batches 0 and 1 only
}

// A remote that fetches block ranges and keeps what its warm reads fetched, piece by piece: it
// counts each piece a warm read (prefetch priority, pieces-only) fetched, and reads of whole
// chunks. Like the cache, a warm read fetches only the pieces not held when it starts (a job of
// the second loader may mix held pieces with ones the first loader's assembly passed).
class PieceKeepingSource final : public testing::ForwardingSource {
 public:
  using ForwardingSource::ForwardingSource;
  Status ReadChunks(const DatasetPtr& d, uint32_t shard, uint64_t first, uint64_t count, const ReadOptions& o,
                    const ChunkSink& sink) override {
    whole_reads_.fetch_add(1);
    return inner_.ReadChunks(d, shard, first, count, o, sink);
  }
  Status ReadPieces(const DatasetPtr& d, uint32_t shard, std::span<const ChunkPiece> pieces,
                    const ReadOptions& o) override {
    if (o.whole_chunks) return ChunkSource::ReadPieces(d, shard, pieces, o);
    std::vector<ChunkPiece> missing;
    {
      std::lock_guard<std::mutex> l(mu_);
      for (const ChunkPiece& p : pieces)
        if (warmed_.count({shard, p.chunk, p.offset}) == 0) missing.push_back(p);
    }
    SC_RETURN_IF_ERROR(inner_.ReadPieces(d, shard, pieces, o));
    if (o.priority == FetchPriority::kPrefetch) {
      std::lock_guard<std::mutex> l(mu_);
      for (const ChunkPiece& p : missing) ++warmed_[{shard, p.chunk, p.offset}];
    }
    return Status::Ok();
  }
  bool HoldsPieces(const DatasetPtr&, uint32_t shard, std::span<const ChunkPiece> pieces) override {
    std::lock_guard<std::mutex> l(mu_);
    return std::all_of(pieces.begin(), pieces.end(),
                       [&](const ChunkPiece& p) { return warmed_.count({shard, p.chunk, p.offset}) > 0; });
  }
  bool FetchesBlockRanges() override { return true; }
  std::map<std::tuple<uint32_t, uint64_t, uint64_t>, int> warmed() {
    std::lock_guard<std::mutex> l(mu_);
    return warmed_;
  }
  std::atomic<int> whole_reads_{0};

 private:
  std::mutex mu_;
  std::map<std::tuple<uint32_t, uint64_t, uint64_t>, int> warmed_;
};

TEST_CASE("warming samples fetches each sample's own bytes once, in pieces, never a whole chunk",
          "[serve][pipeline]") {
  // The global-shuffle warm walk (warm_samples): every sample of the epoch is warmed as its own
  // piece, exactly once, while at most the lookahead is in flight; batches read pieces-only, so
  // no chunk is read whole. A second loader over the same (now holding) source warms nothing.
  GatedFixture f;
  PieceKeepingSource source(*f.files);
  auto arena = serve::Arena::Create(2 << 20, 16);
  REQUIRE(arena.ok());
  serve::BatchAssemblerOptions ao;
  ao.read_threads = 8;
  serve::BatchAssembler assembler(source, ao);
  f.options.lookahead_bytes = 64 * 1024;
  f.options.lookahead_in_flight_only = true;
  f.options.warm_samples = true;
  for (uint64_t loader = 7; loader <= 8; ++loader) {
    LoaderPipeline pipeline(loader, **arena, assembler, f.locator, *f.slice, f.options);
    CHECK(ReadToEnd(pipeline, **arena, loader, 0) == 1024);
    // Warm reads may outlive their loader (the batches need not wait for them); the second
    // loader is to find the source holding every sample, so it starts once they are done.
    REQUIRE(testing::Eventually([&] { return assembler.warm_inflight() == 0; }));
  }
  CHECK(source.whole_reads_.load() == 0);
  const auto warmed = source.warmed();
  // Assembly passes the first samples before the walk reaches them; all the others are warmed.
  CHECK(warmed.size() >= 1024 - 4 * 16);
  CHECK(warmed.size() <= 1024);
  for (const auto& [piece, times] : warmed) {
    INFO("shard " << std::get<0>(piece) << " chunk " << std::get<1>(piece) << " offset " << std::get<2>(piece));
    CHECK(times == 1);
    CHECK(std::get<2>(piece) % 1024 == 0);  // a record's own bytes
  }
}

TEST_CASE("a loader whose client's other loaders hold every slot waits for one instead of failing",
          "[serve][pipeline]") {
  GatedFixture f;
  f.gated->Open();
  auto arena = serve::Arena::Create(1 << 20, 4);
  REQUIRE(arena.ok());
  serve::BatchAssemblerOptions ao;
  ao.read_threads = 4;
  serve::BatchAssembler assembler(*f.gated, ao);
  auto first = std::make_unique<LoaderPipeline>(1, **arena, assembler, f.locator, *f.slice, f.options);
  REQUIRE(testing::Eventually([&] { return (*arena)->FreeSlots() == 0; }));

  LoaderPipeline second(2, **arena, assembler, f.locator, *f.slice, f.options);
  auto d = second.Next(std::chrono::steady_clock::now() + std::chrono::milliseconds(200));
  REQUIRE(d.status().code() == StatusCode::kDeadlineExceeded);
  CHECK(d.status().message().find("other loaders' prefetched batches") != std::string::npos);

  // The first loader's slots come back when it closes; the second one then gets its batch.
  first.reset();
  d = second.Next(std::chrono::steady_clock::now() + std::chrono::seconds(20));
  REQUIRE(d.ok());
  REQUIRE(!d->end_of_epoch);
  CHECK(d->batch.sample_ids.front() == 0);
}

TEST_CASE("a loader stopped while a batch is late publishes none of the batches done behind it",
          "[serve][pipeline]") {
  // The daemon stopping (or the client gone) cancels the loader while batch 1 still reads and
  // batches 2.. wait, done, behind it. Batch 1 is then dropped; were the ones behind it still
  // published, the client (which reads its ring without asking the daemon) would take batch 2
  // as its second, and resuming on a successor after "two batches taken" would repeat batch 2
  // and skip batch 1.
  GatedFixture f;
  auto arena = serve::Arena::Create(2 << 20, 16);
  REQUIRE(arena.ok());
  serve::BatchAssemblerOptions ao;
  ao.read_threads = 4;
  serve::BatchAssembler assembler(*f.gated, ao);
  auto ring = batch_ring::RingWriter::Create(8, 16);
  REQUIRE(ring.ok());
  const uint64_t ring_bytes = (*ring)->bytes();
  void* map = mmap(nullptr, ring_bytes, PROT_READ, MAP_SHARED, (*ring)->fd(), 0);
  REQUIRE(map != MAP_FAILED);
  const auto& header = *reinterpret_cast<const batch_ring::RingHeader*>(map);
  auto pipeline =
      std::make_unique<LoaderPipeline>(3, **arena, assembler, f.locator, *f.slice, f.options, std::move(*ring));
  REQUIRE(testing::Eventually([&] { return f.gated->waiting() > 0; }));
  // Batch 0 is published; the batches behind batch 1 take their slots and finish.
  REQUIRE(testing::Eventually([&] { return 16 - (*arena)->FreeSlots() >= f.options.prefetch_batches; }));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  CHECK(header.published.load() == 1);
  pipeline->Cancel();
  f.gated->Open();
  pipeline.reset();  // waits for batch 1's reads to end
  CHECK(header.published.load() == 1);
  munmap(map, ring_bytes);
}

// 4 shards x 250 records of 1000 bytes in 16 KiB chunks (records straddle chunk edges) behind
// a FlakySource failing chunk 5 of shard 0 `failures` times; a global-shuffle plan in batches
// of 10 and an arena of 8 slots.
struct FlakyRig {
  explicit FlakyRig(int failures) {
    REQUIRE(MakeDirs(root).ok());
    auto d = testing::MakeRecordsDataset(root, "rec", 4, 250, 1000, 16 * 1024);
    REQUIRE(d.ok());
    ds = *d;
    auto f = upstream::FileSource::Open(root);
    REQUIRE(f.ok());
    files = std::move(*f);
    flaky = std::make_unique<FlakySource>(*files, /*bad_chunk=*/5, failures);
    auto a = serve::Arena::Create(2 << 20, 8);
    REQUIRE(a.ok());
    arena = std::move(*a);
    serve::BatchAssemblerOptions ao;
    ao.read_threads = 8;
    assembler = std::make_unique<serve::BatchAssembler>(*flaky, ao);
    locator = std::make_shared<serve::SampleLocator>(*flaky, ds);
    plan::PlanOptions po;
    po.seed = 5;
    po.mode = plan::ShuffleMode::kGlobal;
    auto p = plan::EpochPlan::Make(plan::LayoutOf(*ds), po);
    REQUIRE(p.ok());
    plan::SliceOptions so;
    so.batch_size = 10;
    auto sl = plan::RankSlice::Make(*p, so);
    REQUIRE(sl.ok());
    slice = *sl;
  }
  testing::TempDir tmp;
  std::string root = tmp.path() + "/data";
  dataset::DatasetPtr ds;
  std::unique_ptr<ChunkSource> files;
  std::unique_ptr<FlakySource> flaky;
  std::unique_ptr<serve::Arena> arena;
  std::unique_ptr<serve::BatchAssembler> assembler;
  std::shared_ptr<serve::SampleLocator> locator;
  std::optional<plan::RankSlice> slice;
};

TEST_CASE("a pipeline assembling two batches at once delivers plan order and resumes after a read error",
          "[serve][pipeline]") {
  const int failures = GENERATE(0, 1, 3);
  FlakyRig rig(failures);
  auto& arena = rig.arena;
  auto& flaky = *rig.flaky;

  serve::LoaderPipelineOptions lo;
  lo.prefetch_batches = 4;
  lo.assemble_depth = 2;
  lo.lookahead_bytes = 0;  // no warm reads: the failures reach the batches themselves
  auto pipeline = std::make_unique<LoaderPipeline>(7, *arena, *rig.assembler, rig.locator, *rig.slice, lo);

  std::vector<uint64_t> got;
  int errors = 0;
  for (int calls = 0; calls < 1000; ++calls) {
    auto d = pipeline->Next(std::chrono::steady_clock::now() + std::chrono::seconds(20));
    if (!d.ok()) {
      CHECK(d.status().code() == StatusCode::kUnavailable);
      CHECK(d.status().message().find("injected failure") != std::string::npos);
      ++errors;
      continue;
    }
    if (d->end_of_epoch) break;
    const uint8_t* payload = arena->SlotData(d->slot);
    for (size_t i = 0; i < d->batch.sample_ids.size(); ++i) {
      const uint64_t id = d->batch.sample_ids[i];
      const std::string want = testing::RecordBytes(1, static_cast<uint32_t>(id / 250), id % 250, 1000);
      REQUIRE(d->batch.lengths[i] == 1000);
      REQUIRE(std::string(reinterpret_cast<const char*>(payload + d->batch.offsets[i]), 1000) == want);
      got.push_back(id);
    }
    REQUIRE(arena->Release(d->slot, 7).ok());
  }
  // Every failed read surfaced once (a batch that failed while a later one was in flight may
  // take the later one down with it, but never delivers it early or twice).
  CHECK(errors >= (failures > 0 ? 1 : 0));
  CHECK(errors <= flaky.failed_.load());
  REQUIRE(got.size() == 1000);
  for (uint64_t i = 0; i < got.size(); ++i) REQUIRE(got[i] == rig.slice->SampleAt(i));
  pipeline.reset();
  CHECK(arena->FreeSlots() == 8);
}

TEST_CASE("a pipeline with a batch ring publishes plan order, holds at most its entries, and resumes after a read error",
          "[serve][pipeline]") {
  const int failures = GENERATE(0, 2);
  FlakyRig rig(failures);
  auto& arena = rig.arena;
  serve::LoaderPipelineOptions lo;
  lo.prefetch_batches = 2;
  lo.lookahead_bytes = 0;
  auto ring = batch_ring::RingWriter::Create(3, 10);
  REQUIRE(ring.ok());
  const int ring_fd = (*ring)->fd();
  const uint64_t ring_bytes = (*ring)->bytes();
  LoaderPipeline pipeline(9, *arena, *rig.assembler, rig.locator, *rig.slice, lo, std::move(*ring));
  void* map = mmap(nullptr, ring_bytes, PROT_READ, MAP_SHARED, ring_fd, 0);
  REQUIRE(map != MAP_FAILED);
  const auto* base = static_cast<const uint8_t*>(map);
  const auto& header = *reinterpret_cast<const batch_ring::RingHeader*>(base);
  REQUIRE(header.entries == 3);

  const auto deadline = [] { return std::chrono::steady_clock::now() + std::chrono::seconds(20); };
  std::vector<uint64_t> got;
  std::vector<uint32_t> held;  // slots of entries read and not yet released
  int errors = 0;
  for (uint64_t i = 0;;) {
    auto w = pipeline.WaitPublished(i, deadline());
    if (!w.ok()) {
      CHECK(w.status().message().find("injected failure") != std::string::npos);
      ++errors;
      continue;
    }
    if (w->end_of_epoch) break;
    REQUIRE(header.published.load() > i);
    REQUIRE(header.published.load() <= i + 3 - held.size());
    const uint8_t* at = base + batch_ring::EntryOffset(i, 3, header.stride);
    const auto& e = *reinterpret_cast<const batch_ring::RingEntry*>(at);
    REQUIRE(e.index.load() == i);
    const auto* samples = reinterpret_cast<const batch_ring::RingSample*>(at + sizeof(batch_ring::RingEntry));
    const uint8_t* payload = arena->SlotData(e.slot);
    for (uint32_t k = 0; k < e.samples; ++k) {
      const uint64_t id = samples[k].id;
      REQUIRE(samples[k].length == 1000);
      REQUIRE(std::string(reinterpret_cast<const char*>(payload + samples[k].offset), 1000) ==
              testing::RecordBytes(1, static_cast<uint32_t>(id / 250), id % 250, 1000));
      got.push_back(id);
    }
    held.push_back(e.slot);
    ++i;
    // Hold two batches at a time: with 3 entries the ring never describes more than one ahead.
    if (held.size() == 2) {
      auto next = pipeline.WaitPublished(i, deadline());
      while (!next.ok()) {  // an injected failure; the batch is assembled again
        ++errors;
        next = pipeline.WaitPublished(i, deadline());
      }
      if (!next->end_of_epoch) CHECK(header.published.load() == i + 1);
      REQUIRE(arena->Release(held.front(), 9).ok());
      held.erase(held.begin());
      pipeline.OnReleased();
    }
  }
  CHECK(errors >= (failures > 0 ? 1 : 0));
  REQUIRE(got.size() == 1000);
  for (uint64_t k = 0; k < got.size(); ++k) REQUIRE(got[k] == rig.slice->SampleAt(k));
  // Past the end, and beyond the next unpublished entry.
  auto past = pipeline.WaitPublished(header.published.load(), deadline());
  REQUIRE(past.ok());
  CHECK(past->end_of_epoch);
  CHECK(pipeline.WaitPublished(header.published.load() + 1, deadline()).status().code() ==
        StatusCode::kInvalidArgument);
  CHECK(pipeline.Next(deadline()).status().code() == StatusCode::kFailedPrecondition);
  munmap(map, ring_bytes);
}

}  // namespace
}  // namespace shardcache
