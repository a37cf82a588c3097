#include <catch2/catch.hpp>

#include <atomic>
#include <cstring>
#include <thread>
#include <vector>

#include "common/metrics.h"
#include "daemon/cache/cached_source.h"
#include "tests/cache/cache_test_util.h"
#include "tests/cache/fake_upstream.h"
#include "testing/temp_dir.h"

using namespace shardcache;
using namespace shardcache::cache;
using namespace shardcache::testing;

namespace {

struct Fixture {
  SyntheticDatasetOptions ds_options;
  DatasetPtr dataset;
  FakeUpstream* upstream = nullptr;  // owned by `cache`
  std::unique_ptr<CachedSource> cache;

  Fixture(const CacheOptions& options, SyntheticDatasetOptions dso = {}) : ds_options(dso) {
    dataset = MakeSyntheticDataset(ds_options);
    auto up = std::make_unique<FakeUpstream>();
    up->AddDataset(ds_options, dataset);
    upstream = up.get();
    auto opened = CachedSource::Open(options, std::move(up));
    REQUIRE(opened.ok());
    cache = std::move(*opened);
  }
};

ReadOptions WithDeadline(std::chrono::milliseconds d) {
  ReadOptions o;
  o.deadline = std::chrono::steady_clock::now() + d;
  return o;
}

}  // namespace

TEST_CASE("cached source: a cold read fetches from upstream, a second read hits NVMe with the same bytes",
          "[cache][source]") {
  TempDir dir;
  Fixture f(SmallCacheOptions(dir / "cache"));
  CHECK(ReadAndCompare(*f.cache, f.dataset, f.ds_options) == 0);
  const uint64_t chunks = f.upstream->chunks_sent.load();
  CHECK(chunks == 16);  // 2 shards × 8 chunks of 1 MiB
  f.cache->Flush();
  CHECK(ReadAndCompare(*f.cache, f.dataset, f.ds_options) == 0);
  CHECK(f.upstream->chunks_sent.load() == chunks);  // nothing fetched twice
  auto st = f.cache->Stats();
  CHECK(st.hits_nvme == 16);
  CHECK(st.nvme.entries == 16);
  CHECK(st.nvme.checksum_failures == 0);
}

TEST_CASE("cached source: contiguous misses are fetched as one range call per shard", "[cache][source]") {
  TempDir dir;
  Fixture f(SmallCacheOptions(dir / "cache"));
  CHECK(ReadAndCompare(*f.cache, f.dataset, f.ds_options) == 0);
  CHECK(f.upstream->calls.load() == 2);
}

TEST_CASE("cached source: 16 concurrent readers of one cold chunk cause one upstream fetch",
          "[cache][source][single_flight]") {
  TempDir dir;
  Fixture f(SmallCacheOptions(dir / "cache"));
  f.upstream->delay_ms = 200;  // keep the flight open while the others arrive
  std::atomic<int> ok{0};
  std::vector<std::thread> readers;
  for (int i = 0; i < 16; ++i) {
    readers.emplace_back([&] {
      auto c = f.cache->ReadChunk(f.dataset, 1, 3, ReadOptions());
      if (c.ok() && (*c)->hash == dataset::ChunkHash(f.dataset->manifest, 1, 3)) ++ok;
    });
  }
  for (auto& t : readers) t.join();
  CHECK(ok.load() == 16);
  CHECK(f.upstream->FetchCount(1, 3) == 1);
  CHECK(f.upstream->calls.load() == 1);
  CHECK(f.cache->Stats().joined_flights >= 1);
}

TEST_CASE("cached source: overlapping concurrent range reads fetch every chunk exactly once",
          "[cache][source][single_flight]") {
  TempDir dir;
  SyntheticDatasetOptions dso;
  dso.shards = 1;
  dso.shard_bytes = 32ull << 20;
  Fixture f(SmallCacheOptions(dir / "cache"), dso);
  f.upstream->delay_ms = 20;
  std::atomic<int> bad{0};
  std::vector<std::thread> readers;
  for (int i = 0; i < 8; ++i) {
    readers.emplace_back([&, i] {
      const uint64_t first = static_cast<uint64_t>(i) * 3 % 16;
      Status s = f.cache->ReadChunks(f.dataset, 0, first, 16, ReadOptions(), [&](uint64_t c, const ChunkPtr& chunk) {
        if (chunk->hash != dataset::ChunkHash(f.dataset->manifest, 0, c)) ++bad;
        return Status::Ok();
      });
      if (!s.ok()) ++bad;
    });
  }
  for (auto& t : readers) t.join();
  CHECK(bad.load() == 0);
  for (uint64_t c = 0; c < 32; ++c) CHECK(f.upstream->FetchCount(0, c) <= 1);
}

TEST_CASE("cached source: a chunk that lands while a reader waits is not fetched again by that reader's run",
          "[cache][source][single_flight]") {
  // Reader A looks up chunks 0-2 (all cold), then waits for chunk 0, which B is fetching.
  // Meanwhile C fetches chunk 2. When A goes on, it leads a run from chunk 1 and must end the
  // run at chunk 2, which is now cached, instead of fetching it a second time.
  TempDir dir;
  Fixture f(SmallCacheOptions(dir / "cache"));
  f.upstream->delay_ms = 1000;  // B's flight of chunk 0 stays open
  // Catch2 assertions belong to the test's thread: helpers record, the test checks.
  std::atomic<bool> b_ok{false};
  std::thread b([&] { b_ok = f.cache->ReadChunk(f.dataset, 0, 0, ReadOptions()).ok(); });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  std::atomic<int> bad{0};
  std::thread a([&] {
    Status s = f.cache->ReadChunks(f.dataset, 0, 0, 3, ReadOptions(), [&](uint64_t c, const ChunkPtr& chunk) {
      if (chunk->hash != dataset::ChunkHash(f.dataset->manifest, 0, c)) ++bad;
      return Status::Ok();
    });
    if (!s.ok()) ++bad;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // A is waiting for chunk 0
  f.upstream->delay_ms = 0;
  REQUIRE(f.cache->ReadChunk(f.dataset, 0, 2, ReadOptions()).ok());  // C
  b.join();
  a.join();
  CHECK(b_ok.load());
  CHECK(bad.load() == 0);
  CHECK(f.upstream->FetchCount(0, 0) == 1);
  CHECK(f.upstream->FetchCount(0, 1) == 1);
  CHECK(f.upstream->FetchCount(0, 2) == 1);
}

TEST_CASE("cached source: with the upstream dead, cached chunks are served and the rest fail Unavailable",
          "[cache][source][faults]") {
  TempDir dir;
  Fixture f(SmallCacheOptions(dir / "cache"));
  REQUIRE(f.cache->OpenDataset(f.ds_options.name).ok());
  REQUIRE(f.cache->ReadChunks(f.dataset, 0, 0, 8, ReadOptions(), [](uint64_t, const ChunkPtr&) { return Status::Ok(); }).ok());
  f.cache->Flush();
  f.upstream->fail = true;
  auto hit = f.cache->ReadChunk(f.dataset, 0, 5, WithDeadline(std::chrono::seconds(2)));
  CHECK(hit.ok());
  auto miss = f.cache->ReadChunk(f.dataset, 1, 0, WithDeadline(std::chrono::seconds(2)));
  CHECK(miss.status().code() == StatusCode::kUnavailable);
  // The manifest stays available from the cache while upstream is down.
  auto ds = f.cache->OpenDataset(f.ds_options.name);
  REQUIRE(ds.ok());
  CHECK((*ds)->version == f.dataset->version);
  f.upstream->fail = false;  // upstream back: fetching resumes
  CHECK(f.cache->ReadChunk(f.dataset, 1, 0, ReadOptions()).ok());
}

TEST_CASE("cached source: a stalled upstream fails at the caller's deadline while hits keep flowing",
          "[cache][source][faults]") {
  TempDir dir;
  Fixture f(SmallCacheOptions(dir / "cache"));
  REQUIRE(f.cache->ReadChunk(f.dataset, 0, 0, ReadOptions()).ok());
  f.upstream->stall = true;
  const auto t0 = std::chrono::steady_clock::now();
  std::atomic<StatusCode> staller_code{StatusCode::kOk};
  std::thread staller([&] {
    staller_code = f.cache->ReadChunk(f.dataset, 0, 7, WithDeadline(std::chrono::milliseconds(400))).status().code();
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  // A follower of the stalled flight gives up at its own (earlier) deadline.
  auto follower = f.cache->ReadChunk(f.dataset, 0, 7, WithDeadline(std::chrono::milliseconds(150)));
  CHECK(follower.status().code() == StatusCode::kDeadlineExceeded);
  // Cached data is served while the fetch is stuck.
  const auto h0 = std::chrono::steady_clock::now();
  CHECK(f.cache->ReadChunk(f.dataset, 0, 0, ReadOptions()).ok());
  CHECK(std::chrono::steady_clock::now() - h0 < std::chrono::milliseconds(200));
  staller.join();
  CHECK(staller_code.load() == StatusCode::kDeadlineExceeded);
  const auto waited = std::chrono::steady_clock::now() - t0;
  CHECK(waited >= std::chrono::milliseconds(390));
  CHECK(waited < std::chrono::seconds(3));
  f.upstream->stall = false;
}

TEST_CASE("cached source: corrupt bytes from upstream are never served or stored", "[cache][source][faults]") {
  TempDir dir;
  Fixture f(SmallCacheOptions(dir / "cache"));
  f.upstream->corrupt_next = 1;
  auto r = f.cache->ReadChunk(f.dataset, 0, 2, ReadOptions());
  CHECK(r.status().code() == StatusCode::kDataLoss);
  f.cache->Flush();
  CHECK(f.cache->Stats().nvme.entries == 0);
  auto again = f.cache->ReadChunk(f.dataset, 0, 2, ReadOptions());
  REQUIRE(again.ok());
  CHECK((*again)->hash == dataset::ChunkHash(f.dataset->manifest, 0, 2));
}

TEST_CASE("cached source: a dataset can be evicted, and shrinking the budget evicts while serving",
          "[cache][source]") {
  TempDir dir;
  SyntheticDatasetOptions dso;
  dso.shards = 4;
  Fixture f(SmallCacheOptions(dir / "cache", 64ull << 20), dso);
  CHECK(ReadAndCompare(*f.cache, f.dataset, f.ds_options) == 0);
  f.cache->Flush();
  CHECK(f.cache->Stats().nvme.entries == 32);
  REQUIRE(f.cache->SetSizeBytes(16ull << 20).ok());  // 4 MiB reserve + room for 2 segments
  auto st = f.cache->Stats();
  CHECK(st.nvme.segment_allocated_bytes + st.nvme.index_allowance_bytes <= (16ull << 20));
  CHECK(DuBytes(dir / "cache") <= (16ull << 20));
  CHECK(ReadAndCompare(*f.cache, f.dataset, f.ds_options) == 0);  // still correct
  f.cache->Flush();
  REQUIRE(f.cache->Evict(f.ds_options.name).ok());
  CHECK(f.cache->Stats().nvme.entries == 0);
  const uint64_t before = f.upstream->chunks_sent.load();
  CHECK(f.cache->ReadChunk(f.dataset, 0, 0, ReadOptions()).ok());
  CHECK(f.upstream->chunks_sent.load() == before + 1);
}

TEST_CASE("cached source: metrics count bytes per tier", "[cache][source][metrics]") {
  TempDir dir;
  Fixture f(SmallCacheOptions(dir / "cache"));
  auto& reg = metrics::Registry::Global();
  const double up0 = reg.ValueOf("shardcache_cache_served_bytes_total", {{"tier", "upstream"}});
  const double nv0 = reg.ValueOf("shardcache_cache_served_bytes_total", {{"tier", "nvme"}});
  CHECK(ReadAndCompare(*f.cache, f.dataset, f.ds_options) == 0);
  f.cache->Flush();
  CHECK(ReadAndCompare(*f.cache, f.dataset, f.ds_options) == 0);
  CHECK(reg.ValueOf("shardcache_cache_served_bytes_total", {{"tier", "upstream"}}) - up0 == Approx(16 << 20));
  CHECK(reg.ValueOf("shardcache_cache_served_bytes_total", {{"tier", "nvme"}}) - nv0 == Approx(16 << 20));
  CHECK(reg.RenderPrometheus().find("shardcache_cache_nvme_read_seconds_bucket") != std::string::npos);
}

TEST_CASE("cached source: its Stats() and /metrics read the same counters, and a closed cache's counts stay",
          "[cache][source][metrics]") {
  // Issue 15: the tiers counted each event twice (an atomic for Stats() and a Registry counter);
  // now the Registry renders the cache's own counters (stats::Source), so both always agree.
  TempDir dir;
  auto& reg = metrics::Registry::Global();
  auto value = [&](const char* name, metrics::Labels labels = {}) { return reg.ValueOf(name, labels); };
  const double up0 = value("shardcache_cache_served_bytes_total", {{"tier", "upstream"}});
  const double hits0 = value("shardcache_cache_hits_total", {{"tier", "nvme"}});
  const double misses0 = value("shardcache_cache_misses_total");
  const double fetched0 = value("shardcache_cache_upstream_fetched_chunks_total");
  const double written0 = value("shardcache_cache_written_bytes_total");
  CacheStats st;
  {
    Fixture f(SmallCacheOptions(dir / "cache"));
    CHECK(ReadAndCompare(*f.cache, f.dataset, f.ds_options) == 0);
    f.cache->Flush();
    CHECK(ReadAndCompare(*f.cache, f.dataset, f.ds_options) == 0);
    st = f.cache->Stats();
    CHECK(value("shardcache_cache_served_bytes_total", {{"tier", "upstream"}}) - up0 == st.served_upstream_bytes);
    CHECK(value("shardcache_cache_hits_total", {{"tier", "nvme"}}) - hits0 == st.hits_nvme);
    CHECK(value("shardcache_cache_misses_total") - misses0 == st.misses);
    CHECK(value("shardcache_cache_upstream_fetched_chunks_total") - fetched0 == st.upstream_fetched_chunks);
    CHECK(value("shardcache_cache_written_bytes_total") - written0 == st.nvme.written_bytes);
    CHECK(value("shardcache_cache_dram_used_bytes") == st.dram_used_bytes);
    CHECK(value("shardcache_cache_nvme_budget_bytes") == st.nvme.size_bytes);
    CHECK(st.hits_nvme == 16);
  }
  // Closed: its counters stay in their series (Prometheus counters never go down), its gauges go.
  CHECK(value("shardcache_cache_served_bytes_total", {{"tier", "upstream"}}) - up0 == st.served_upstream_bytes);
  CHECK(value("shardcache_cache_hits_total", {{"tier", "nvme"}}) - hits0 == st.hits_nvme);
  CHECK(value("shardcache_cache_written_bytes_total") - written0 == st.nvme.written_bytes);
  CHECK(value("shardcache_cache_dram_used_bytes") == 0);
}

TEST_CASE("cached source: the DRAM tier answers repeated reads without touching NVMe", "[cache][source][dram]") {
  TempDir dir;
  auto o = SmallCacheOptions(dir / "cache");
  o.memory_bytes = 64ull << 20;
  Fixture f(o);
  CHECK(ReadAndCompare(*f.cache, f.dataset, f.ds_options) == 0);
  CHECK(ReadAndCompare(*f.cache, f.dataset, f.ds_options) == 0);
  auto st = f.cache->Stats();
  CHECK(st.hits_dram == 16);
  CHECK(st.hits_nvme == 0);
}

TEST_CASE("cached source: size 0 is a pass-through that still shares fetches", "[cache][source]") {
  CacheOptions o;
  o.size_bytes = 0;
  o.memory_bytes = 0;
  Fixture f(o);
  CHECK(ReadAndCompare(*f.cache, f.dataset, f.ds_options) == 0);
  CHECK(ReadAndCompare(*f.cache, f.dataset, f.ds_options) == 0);
  CHECK(f.upstream->chunks_sent.load() == 32);
  CHECK_FALSE(f.cache->Stats().nvme_enabled);
}

TEST_CASE("cached source: a nested dataset name is cached, evicted, and remembered across a restart with the upstream down",
          "[cache][source][names]") {
  TempDir dir;
  SyntheticDatasetOptions dso;
  dso.name = "laion/train";
  const auto options = SmallCacheOptions(dir / "cache");
  {
    Fixture f(options, dso);
    auto d = f.cache->OpenDataset("laion/train");
    REQUIRE(d.ok());
    CHECK((*d)->name == "laion/train");
    CHECK(ReadAndCompare(*f.cache, *d, dso) == 0);
    f.cache->Flush();
    REQUIRE(f.cache->Evict("laion/train").ok());
    CHECK(f.cache->Stats().nvme.entries == 0);
    CHECK(f.cache->Evict("laion/../x").code() == StatusCode::kInvalidArgument);
    CHECK(ReadAndCompare(*f.cache, *d, dso) == 0);  // fetched and stored again
  }
  auto down = std::make_unique<FakeUpstream>();
  down->fail = true;
  auto restarted = CachedSource::Open(options, std::move(down));
  REQUIRE(restarted.ok());
  auto d = (*restarted)->OpenDataset("laion/train");
  REQUIRE(d.ok());
  CHECK((*d)->name == "laion/train");
  CHECK(ReadAndCompare(**restarted, *d, dso) == 0);
  CHECK((*restarted)->Stats().hits_nvme > 0);
}
