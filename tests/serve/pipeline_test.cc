// LoaderPipeline on its own: two batches assembled at once, finishing in any order, are still
// delivered in plan order; a read error is reported once and the pipeline resumes at the
// failed batch, so the trainer sees every sample of the epoch exactly once, in order.
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <thread>

#include "daemon/plan/epoch_plan.h"
#include "daemon/serve/arena.h"
#include "daemon/serve/batch_assembler.h"
#include "daemon/serve/prefetcher.h"
#include "daemon/upstream/file_source.h"
#include "testing/datasets.h"
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

TEST_CASE("a pipeline assembling two batches at once delivers plan order and resumes after a read error",
          "[serve][pipeline]") {
  testing::TempDir tmp;
  const std::string root = tmp.path() + "/data";
  REQUIRE(MakeDirs(root).ok());
  // 4 shards x 250 records of 1000 bytes in 16 KiB chunks: records straddle chunk edges.
  auto ds = testing::MakeRecordsDataset(root, "rec", 4, 250, 1000, 16 * 1024);
  REQUIRE(ds.ok());
  auto files = upstream::FileSource::Open(root);
  REQUIRE(files.ok());
  const int failures = GENERATE(0, 1, 3);
  FlakySource flaky(**files, /*bad_chunk=*/5, failures);

  auto arena = serve::Arena::Create(2 << 20, 8);
  REQUIRE(arena.ok());
  serve::BatchAssemblerOptions ao;
  ao.read_threads = 8;
  serve::BatchAssembler assembler(flaky, ao);
  auto locator = std::make_shared<serve::SampleLocator>(flaky, *ds);
  plan::PlanOptions po;
  po.seed = 5;
  po.mode = plan::ShuffleMode::kGlobal;
  po.batch_size = 10;
  auto plan = plan::EpochPlan::Make(plan::LayoutOf(**ds), po);
  REQUIRE(plan.ok());

  serve::LoaderPipelineOptions lo;
  lo.batch_size = 10;
  lo.prefetch_batches = 4;
  lo.assemble_depth = 2;
  lo.lookahead_bytes = 0;  // no warm reads: the failures reach the batches themselves
  auto pipeline = std::make_unique<LoaderPipeline>(7, **arena, assembler, locator, *plan, lo, 0);

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
    const uint8_t* payload = (*arena)->SlotData(d->slot);
    for (size_t i = 0; i < d->batch.sample_ids.size(); ++i) {
      const uint64_t id = d->batch.sample_ids[i];
      const std::string want = testing::RecordBytes(1, static_cast<uint32_t>(id / 250), id % 250, 1000);
      REQUIRE(d->batch.lengths[i] == 1000);
      REQUIRE(std::string(reinterpret_cast<const char*>(payload + d->batch.offsets[i]), 1000) == want);
      got.push_back(id);
    }
    REQUIRE((*arena)->Release(d->slot, 7).ok());
  }
  // Every failed read surfaced once (a batch that failed while a later one was in flight may
  // take the later one down with it, but never delivers it early or twice).
  CHECK(errors >= (failures > 0 ? 1 : 0));
  CHECK(errors <= flaky.failed_.load());
  REQUIRE(got.size() == 1000);
  for (uint64_t i = 0; i < got.size(); ++i) REQUIRE(got[i] == (*plan)->SampleAt(0, i));
  pipeline.reset();
  CHECK((*arena)->FreeSlots() == 8);
}

}  // namespace
}  // namespace shardcache
