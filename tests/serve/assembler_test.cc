// BatchAssembler and the two non-blocking ChunkSource shortcuts: a batch whose runs are all in
// memory (ChunkSource::ReadPiecesFromMemory) is copied on the caller's thread and reported
// before AssembleAsync returns, with no reader-pool hop; runs that are not go through
// ReadPieces on a reader thread, and the batch is still byte-exact. TryWarm of a range the
// source already holds (ChunkSource::Holds) is true at once, starts no Prefetch and takes no
// warm capacity.
//
// ShortcutSource, a FileSource behind switches, decides what is "in memory" and "held", records
// the thread of every call and can hold Prefetch at a gate.
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include "common/metrics.h"
#include "daemon/serve/batch_assembler.h"
#include "daemon/upstream/file_source.h"
#include "testing/datasets.h"
#include "testing/eventually.h"
#include "testing/forwarding_source.h"
#include "testing/temp_dir.h"

namespace shardcache {
namespace {

using ChunkId = std::pair<uint32_t, uint64_t>;  // (shard, chunk)
using Clock = std::chrono::steady_clock;

constexpr uint64_t kRecordBytes = 1000;
constexpr uint64_t kRecordsPerShard = 100;
constexpr uint64_t kChunkBytes = 16 * 1024;  // records straddle chunk edges; 7 chunks a shard
constexpr uint8_t kGuard = 0xEE;

// The file source with switches: ReadPiecesFromMemory serves (copying through the file source)
// only when every piece's chunk is marked in memory, Holds is true for ranges of chunks marked
// held, Prefetch waits at a gate while it is closed (5 s at most). Switches are set before the
// assembler uses the source.
class ShortcutSource final : public testing::ForwardingSource {
 public:
  using ForwardingSource::ForwardingSource;

  std::set<ChunkId> in_memory;
  std::set<ChunkId> held;

  struct Call {
    std::thread::id thread;
    uint32_t shard = 0;
    uint64_t first_chunk = 0;  // smallest chunk of the pieces
  };

  bool ReadPiecesFromMemory(const DatasetPtr& d, uint32_t shard, std::span<const ChunkPiece> pieces,
                            FetchPriority priority) override {
    std::lock_guard<std::mutex> l(mu_);
    ++memory_calls_;
    if (priority != FetchPriority::kDemand) ++non_demand_memory_calls_;
    for (const ChunkPiece& p : pieces) {
      if (!in_memory.count({shard, p.chunk})) return false;  // copies nothing
    }
    if (!inner_.ReadPieces(d, shard, pieces, ReadOptions()).ok()) return false;
    memory_served_.push_back(CallOf(shard, pieces));
    return true;
  }

  Status ReadPieces(const DatasetPtr& d, uint32_t shard, std::span<const ChunkPiece> pieces,
                    const ReadOptions& o) override {
    {
      std::lock_guard<std::mutex> l(mu_);
      read_pieces_.push_back(CallOf(shard, pieces));
    }
    return inner_.ReadPieces(d, shard, pieces, o);
  }

  Status ReadChunks(const DatasetPtr& d, uint32_t shard, uint64_t first, uint64_t count,
                    const ReadOptions& o, const ChunkSink& sink) override {
    read_chunks_calls_.fetch_add(1);
    return inner_.ReadChunks(d, shard, first, count, o, sink);
  }

  bool Holds(const DatasetPtr&, uint32_t shard, uint64_t first, uint64_t count) override {
    for (uint64_t c = first; c < first + count; ++c) {
      if (!held.count({shard, c})) return false;
    }
    return count > 0;
  }

  Status Prefetch(const DatasetPtr&, uint32_t, uint64_t, uint64_t, const ReadOptions&) override {
    prefetch_calls_.fetch_add(1);
    std::unique_lock<std::mutex> l(gate_mu_);
    gate_cv_.wait_for(l, std::chrono::seconds(5), [&] { return gate_open_; });
    return Status::Ok();
  }

  void SetGate(bool open) {
    {
      std::lock_guard<std::mutex> l(gate_mu_);
      gate_open_ = open;
    }
    gate_cv_.notify_all();
  }

  int memory_calls() const { std::lock_guard<std::mutex> l(mu_); return memory_calls_; }
  int non_demand_memory_calls() const { std::lock_guard<std::mutex> l(mu_); return non_demand_memory_calls_; }
  std::vector<Call> memory_served() const { std::lock_guard<std::mutex> l(mu_); return memory_served_; }
  std::vector<Call> read_pieces() const { std::lock_guard<std::mutex> l(mu_); return read_pieces_; }
  int read_chunks_calls() const { return read_chunks_calls_.load(); }
  int prefetch_calls() const { return prefetch_calls_.load(); }

 private:
  static Call CallOf(uint32_t shard, std::span<const ChunkPiece> pieces) {
    Call c{std::this_thread::get_id(), shard, UINT64_MAX};
    for (const ChunkPiece& p : pieces) c.first_chunk = std::min(c.first_chunk, p.chunk);
    return c;
  }

  mutable std::mutex mu_;
  int memory_calls_ = 0;              // GUARDED_BY(mu_)
  int non_demand_memory_calls_ = 0;   // GUARDED_BY(mu_)
  std::vector<Call> memory_served_;   // GUARDED_BY(mu_)
  std::vector<Call> read_pieces_;     // GUARDED_BY(mu_)
  std::atomic<int> read_chunks_calls_{0};
  std::atomic<int> prefetch_calls_{0};

  std::mutex gate_mu_;
  std::condition_variable gate_cv_;
  bool gate_open_ = true;  // GUARDED_BY(gate_mu_)
};

// Opens the gate when it goes out of scope: declared after the assembler, so a failed REQUIRE
// cannot leave the assembler's destructor waiting on a blocked Prefetch.
struct GateOpener {
  ShortcutSource& source;
  ~GateOpener() { source.SetGate(true); }
};

// A records dataset of 2 shards x 100 records of 1000 bytes in 16 KiB chunks, behind a
// ShortcutSource.
struct Fixture {
  testing::TempDir tmp;
  DatasetPtr dataset;
  std::unique_ptr<upstream::FileSource> files;
  std::unique_ptr<ShortcutSource> source;

  Fixture() {
    const std::string root = tmp.path() + "/data";
    REQUIRE(MakeDirs(root).ok());
    auto ds = testing::MakeRecordsDataset(root, "rec", 2, kRecordsPerShard, kRecordBytes, kChunkBytes);
    REQUIRE(ds.ok());
    dataset = *ds;
    auto f = upstream::FileSource::Open(root);
    REQUIRE(f.ok());
    files = std::move(*f);
    source = std::make_unique<ShortcutSource>(*files);
  }

  std::set<ChunkId> AllChunksOf(uint32_t shard) const {
    std::set<ChunkId> out;
    for (uint64_t c = 0; c < dataset::ChunkCount(dataset->manifest, shard); ++c) out.insert({shard, c});
    return out;
  }
};

// Samples of both shards, with records that straddle chunk edges (16, 65). The runs they need:
// shard 0 chunks [0, 5); shard 1 chunks [1, 2), [3, 4) and [6, 7).
const std::vector<uint64_t> kIds = {150, 3, 42, 199, 0, 17, 120, 16, 65};

// What `done` saw, and when.
struct DoneProbe {
  std::mutex mu;
  std::condition_variable cv;
  int calls = 0;
  std::thread::id thread;
  bool before_return = false;
  Status status;
  serve::AssembledBatch batch;
  std::atomic<bool> returned{false};

  serve::BatchAssembler::AssembleDone Callback() {
    return [this](Status s, serve::AssembledBatch b) {
      std::lock_guard<std::mutex> l(mu);
      ++calls;
      thread = std::this_thread::get_id();
      before_return = !returned.load();
      status = std::move(s);
      batch = std::move(b);
      cv.notify_all();
    };
  }
  // Waits (2 s at most) for the first call; true when it came.
  bool Wait() {
    std::unique_lock<std::mutex> l(mu);
    return cv.wait_for(l, std::chrono::seconds(2), [&] { return calls > 0; });
  }
};

// Assembles kIds into a guarded buffer and checks every payload byte against the records.
struct Assembled {
  std::vector<uint8_t> buf;
  std::thread::id caller = std::this_thread::get_id();
  DoneProbe probe;

  void Run(serve::BatchAssembler& assembler, serve::SampleLocator& locator) {
    buf.assign(kIds.size() * kRecordBytes + 4096, kGuard);
    assembler.AssembleAsync(locator, kIds, buf.data(), buf.size(), probe.Callback());
    probe.returned = true;
  }

  void CheckPayload() {
    std::lock_guard<std::mutex> l(probe.mu);
    REQUIRE(probe.status.ok());
    const serve::AssembledBatch& b = probe.batch;
    REQUIRE(b.sample_ids == kIds);
    REQUIRE(b.payload_bytes == kIds.size() * kRecordBytes);
    for (size_t i = 0; i < kIds.size(); ++i) {
      const uint64_t id = kIds[i];
      INFO("sample " << id);
      REQUIRE(b.lengths[i] == kRecordBytes);
      const std::string want = testing::RecordBytes(1, static_cast<uint32_t>(id / kRecordsPerShard),
                                                    id % kRecordsPerShard, kRecordBytes);
      CHECK(std::memcmp(buf.data() + b.offsets[i], want.data(), kRecordBytes) == 0);
    }
    CHECK(std::all_of(buf.begin() + static_cast<std::ptrdiff_t>(b.payload_bytes), buf.end(),
                      [](uint8_t x) { return x == kGuard; }));
  }
};

std::set<ChunkId> FirstChunks(const std::vector<ShortcutSource::Call>& calls) {
  std::set<ChunkId> out;
  for (const auto& c : calls) out.insert({c.shard, c.first_chunk});
  return out;
}

TEST_CASE("assembler: a batch whose chunks are all in memory is copied on the caller and reported before "
          "AssembleAsync returns",
          "[serve][assembler]") {
  Fixture f;
  for (uint32_t s = 0; s < 2; ++s) {
    for (const ChunkId& c : f.AllChunksOf(s)) f.source->in_memory.insert(c);
  }
  serve::BatchAssemblerOptions ao;
  ao.read_threads = 4;
  serve::BatchAssembler assembler(*f.source, ao);
  serve::SampleLocator locator(*f.source, f.dataset);

  Assembled a;
  a.Run(assembler, locator);
  REQUIRE(a.probe.Wait());
  {
    std::lock_guard<std::mutex> l(a.probe.mu);
    CHECK(a.probe.calls == 1);
    CHECK(a.probe.thread == a.caller);
    CHECK(a.probe.before_return);
    CHECK(a.probe.batch.chunks_read == 8);  // shard 0: 0-4; shard 1: 1, 3, 6
  }
  a.CheckPayload();
  // Every run was served from memory, on the caller, as demand; nothing went to the pool.
  const auto served = f.source->memory_served();
  CHECK(FirstChunks(served) == std::set<ChunkId>{{0, 0}, {1, 1}, {1, 3}, {1, 6}});
  for (const auto& c : served) CHECK(c.thread == a.caller);
  CHECK(f.source->non_demand_memory_calls() == 0);
  CHECK(f.source->read_pieces().empty());
  CHECK(f.source->read_chunks_calls() == 0);
  // done ran exactly once, even after the pool had time to run anything stray.
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  std::lock_guard<std::mutex> l(a.probe.mu);
  CHECK(a.probe.calls == 1);
}

TEST_CASE("assembler: runs with a chunk that is not in memory are read on a reader thread, the rest are not "
          "read again, and the batch is exact",
          "[serve][assembler]") {
  Fixture f;
  std::set<ChunkId> in_memory;
  std::set<ChunkId> want_read;  // (shard, first chunk) of the runs that must go to the pool
  SECTION("shard 0 in memory, shard 1 not") {
    in_memory = f.AllChunksOf(0);
    want_read = {{1, 1}, {1, 3}, {1, 6}};
  }
  SECTION("nothing in memory") {
    want_read = {{0, 0}, {1, 1}, {1, 3}, {1, 6}};
  }
  SECTION("all but one chunk of the shard 0 run and the last chunk of shard 1") {
    in_memory = f.AllChunksOf(0);
    for (const ChunkId& c : f.AllChunksOf(1)) in_memory.insert(c);
    in_memory.erase({0, 4});
    in_memory.erase({1, 6});
    want_read = {{0, 0}, {1, 6}};
  }
  f.source->in_memory = in_memory;
  serve::BatchAssemblerOptions ao;
  ao.read_threads = 4;
  serve::BatchAssembler assembler(*f.source, ao);
  serve::SampleLocator locator(*f.source, f.dataset);

  Assembled a;
  a.Run(assembler, locator);
  REQUIRE(a.probe.Wait());
  {
    std::lock_guard<std::mutex> l(a.probe.mu);
    CHECK(a.probe.calls == 1);
    CHECK(a.probe.thread != a.caller);  // the last pool read reports the batch
  }
  a.CheckPayload();
  const auto read = f.source->read_pieces();
  CHECK(FirstChunks(read) == want_read);
  CHECK(read.size() == want_read.size());
  for (const auto& c : read) CHECK(c.thread != a.caller);
  // Runs served from memory were served on the caller, and only they.
  const auto served = f.source->memory_served();
  for (const auto& c : served) CHECK(c.thread == a.caller);
  CHECK(served.size() + read.size() == 4);
  for (const auto& c : FirstChunks(served)) CHECK(want_read.count(c) == 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  std::lock_guard<std::mutex> l(a.probe.mu);
  CHECK(a.probe.calls == 1);
}

TEST_CASE("assembler: TryWarm of a range the source holds is true at once, starts no Prefetch and takes no "
          "warm capacity",
          "[serve][assembler][warm]") {
  Fixture f;
  for (uint64_t c = 0; c < 5; ++c) f.source->held.insert({0, c});  // shard 0 chunks [0, 5)
  serve::BatchAssemblerOptions ao;
  ao.read_threads = 2;
  ao.max_warm_inflight = 1;
  serve::BatchAssembler assembler(*f.source, ao);
  GateOpener opener{*f.source};
  auto* warm_reads = metrics::Registry::Global().GetCounter(
      "shardcache_serve_warm_reads_total", "Chunks read ahead of demand by the prefetcher");
  const uint64_t warm_before = warm_reads->Value();
  std::atomic<int> asked{0};
  auto still_wanted = [&] {
    asked.fetch_add(1);
    return true;
  };

  // Held, with capacity free.
  CHECK(assembler.TryWarm(f.dataset, 0, 0, 3, still_wanted));
  CHECK(assembler.warm_inflight() == 0);

  // A range that is not held takes the only warm slot and waits at the gate.
  f.source->SetGate(false);
  CHECK(assembler.TryWarm(f.dataset, 1, 0, 2, still_wanted));
  REQUIRE(testing::Eventually([&] { return f.source->prefetch_calls() == 1; }, std::chrono::seconds(2)));
  CHECK(assembler.warm_inflight() == 1);

  // With no capacity left: held ranges are still true, others are refused.
  CHECK(assembler.TryWarm(f.dataset, 0, 2, 3, still_wanted));
  CHECK(assembler.TryWarm(f.dataset, 0, 0, 5, still_wanted));
  CHECK_FALSE(assembler.TryWarm(f.dataset, 1, 3, 2, still_wanted));
  CHECK_FALSE(assembler.TryWarm(f.dataset, 0, 3, 3, still_wanted));  // chunk 5 is not held
  CHECK(assembler.warm_inflight() == 1);

  f.source->SetGate(true);
  REQUIRE(testing::Eventually([&] { return assembler.warm_inflight() == 0; }, std::chrono::seconds(2)));
  CHECK(f.source->prefetch_calls() == 1);
  CHECK(asked.load() == 1);  // only the queued warm read asked whether it was still wanted
  CHECK(warm_reads->Value() - warm_before == 2);  // the 2 chunks of shard 1, not the held ones

  // A range held only in part is warmed.
  CHECK(assembler.TryWarm(f.dataset, 0, 3, 3, still_wanted));
  REQUIRE(testing::Eventually([&] { return assembler.warm_inflight() == 0 && f.source->prefetch_calls() == 2; },
                              std::chrono::seconds(2)));
  CHECK(warm_reads->Value() - warm_before == 5);
  CHECK(f.source->read_chunks_calls() == 0);
}

// A file source whose GetSampleIndex takes kIndexDelay (an upstream round trip) and can fail
// for one shard; it counts the calls per shard and the most that ran at once.
class SlowIndexSource final : public testing::ForwardingSource {
 public:
  using ForwardingSource::ForwardingSource;
  static constexpr auto kIndexDelay = std::chrono::milliseconds(100);
  int failing_shard = -1;

  Result<std::string> GetSampleIndex(const DatasetPtr& d, uint32_t shard) override {
    {
      std::lock_guard<std::mutex> l(mu_);
      ++calls_[shard];
      max_running_ = std::max(max_running_, ++running_);
    }
    std::this_thread::sleep_for(kIndexDelay);
    {
      std::lock_guard<std::mutex> l(mu_);
      --running_;
    }
    if (static_cast<int>(shard) == failing_shard) return Unavailable("index server down for shard " + std::to_string(shard));
    return inner_.GetSampleIndex(d, shard);
  }
  Status ReadPieces(const DatasetPtr& d, uint32_t shard, std::span<const ChunkPiece> pieces,
                    const ReadOptions& o) override {
    return inner_.ReadPieces(d, shard, pieces, o);
  }

  std::map<uint32_t, int> calls() const { std::lock_guard<std::mutex> l(mu_); return calls_; }
  int max_running() const { std::lock_guard<std::mutex> l(mu_); return max_running_; }

 private:
  mutable std::mutex mu_;
  std::map<uint32_t, int> calls_;  // GUARDED_BY(mu_)
  int running_ = 0;                // GUARDED_BY(mu_)
  int max_running_ = 0;            // GUARDED_BY(mu_)
};

// A tar dataset of 8 shards x 4 samples behind a SlowIndexSource; one batch holds sample 1 of
// every shard (a global shuffle's first batch touches as many shards as it has samples).
struct TarFixture {
  static constexpr int kShards = 8;
  testing::TempDir tmp;
  DatasetPtr dataset;
  std::unique_ptr<upstream::FileSource> files;
  std::unique_ptr<SlowIndexSource> source;
  std::vector<uint64_t> ids;

  TarFixture() {
    const std::string root = tmp.path() + "/data";
    REQUIRE(MakeDirs(root).ok());
    auto ds = testing::MakeTarDataset(root, "tar", kShards, 4, 500, 2000);
    REQUIRE(ds.ok());
    dataset = *ds;
    auto f = upstream::FileSource::Open(root);
    REQUIRE(f.ok());
    files = std::move(*f);
    source = std::make_unique<SlowIndexSource>(*files);
    for (uint64_t s = 0; s < kShards; ++s) ids.push_back(s * 4 + 1);
  }
};

TEST_CASE("assembler: a batch over many shards loads their sample indexes in parallel, each once",
          "[serve][assembler]") {
  TarFixture f;
  serve::BatchAssembler assembler(*f.source);
  serve::SampleLocator locator(*f.source, f.dataset);
  std::vector<uint8_t> buf(1 << 20);
  DoneProbe probe;
  const auto t0 = Clock::now();
  assembler.AssembleAsync(locator, f.ids, buf.data(), buf.size(), probe.Callback());
  REQUIRE(probe.Wait());
  const auto took = Clock::now() - t0;
  // The same batch read straight from the files (no delay) is the reference.
  serve::BatchAssembler plain(*f.files);
  serve::SampleLocator plain_locator(*f.files, f.dataset);
  std::vector<uint8_t> want(1 << 20);
  DoneProbe reference;
  plain.AssembleAsync(plain_locator, f.ids, want.data(), want.size(), reference.Callback());
  REQUIRE(reference.Wait());
  {
    std::lock_guard<std::mutex> l(probe.mu), r(reference.mu);
    REQUIRE(probe.status.ok());
    REQUIRE(reference.status.ok());
    REQUIRE(probe.batch.payload_bytes == reference.batch.payload_bytes);
    CHECK(probe.batch.lengths == reference.batch.lengths);
    CHECK(std::memcmp(buf.data(), want.data(), probe.batch.payload_bytes) == 0);
  }
  const auto calls = f.source->calls();
  CHECK(calls.size() == static_cast<size_t>(TarFixture::kShards));
  for (const auto& [shard, n] : calls) CHECK(n == 1);
  // One after another they would take 8 x 100 ms.
  CHECK(f.source->max_running() >= 4);
  CHECK(took < 6 * SlowIndexSource::kIndexDelay);
}

TEST_CASE("assembler: a sample index that cannot be loaded fails the batch with an error naming its shard",
          "[serve][assembler]") {
  TarFixture f;
  f.source->failing_shard = 5;
  serve::BatchAssembler assembler(*f.source);
  serve::SampleLocator locator(*f.source, f.dataset);
  std::vector<uint8_t> buf(1 << 20);
  DoneProbe probe;
  assembler.AssembleAsync(locator, f.ids, buf.data(), buf.size(), probe.Callback());
  REQUIRE(probe.Wait());
  std::lock_guard<std::mutex> l(probe.mu);
  CHECK(probe.status.code() == StatusCode::kUnavailable);
  CHECK_THAT(probe.status.message(), Catch::Contains("shard 5"));
  // The other shards' indexes were loaded and stay: the next batch asks only for shard 5's.
  for (const auto& [shard, n] : f.source->calls()) CHECK(n == 1);
}

}  // namespace
}  // namespace shardcache
