// Crash safety: a child process fills the cache and is killed with SIGKILL at a random moment;
// the parent reopens the cache with a dead upstream (so every byte it serves comes from the
// cache), checks every served chunk byte for byte and measures the directory with du. The
// filler reads whole chunks, or (runs) only samples' pieces, which the cache keeps as runs
// (partial chunks, chunk_run.h).
//
// The child is this test binary re-executed through /proc/self/exe with SC_CACHE_FILL_DIR set:
// a Catch listener below turns it into the filler as the test run starts (a plain fork of a
// process that already has RocksDB threads would not be safe).
#define CATCH_CONFIG_EXTERNAL_INTERFACES  // listeners
#include <catch2/catch.hpp>

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <random>
#include <thread>

#include <spdlog/spdlog.h>

#include "daemon/cache/cached_source.h"
#include "tests/cache/cache_test_util.h"
#include "tests/cache/fake_upstream.h"
#include "testing/process.h"
#include "testing/temp_dir.h"

using namespace shardcache;
using namespace shardcache::cache;
using namespace shardcache::testing;

namespace {

constexpr uint64_t kCrashBudget = 32ull << 20;

SyntheticDatasetOptions CrashDataset() {
  SyntheticDatasetOptions d;
  d.name = "crash";
  d.shards = 12;  // 96 MiB: three times the cache, so the filler also evicts
  d.shard_bytes = 8ull << 20;
  d.chunk_bytes = 1ull << 20;
  return d;
}

CacheOptions CrashCacheOptions(const std::string& dir) {
  auto o = SmallCacheOptions(dir, kCrashBudget);
  o.commit_bytes = 3ull << 20;  // commit often, so kills land on every step of the protocol
  return o;
}

// The pieces the runs filler reads: 6 per chunk, of odd offsets and lengths.
std::vector<ChunkPiece> CrashPieces(const DatasetPtr& ds, uint32_t shard) {
  std::vector<ChunkPiece> out;
  for (uint64_t c = 0; c < dataset::ChunkCount(ds->manifest, shard); ++c) {
    const uint64_t length = dataset::ChunkLength(ds->manifest, shard, c);
    for (uint64_t k = 0; k < 6; ++k) {
      const uint64_t offset = (k * 157 * 1024 + c * 13) % (length - 40000);
      out.push_back(ChunkPiece{c, offset, 12000 + k * 4099 + c, nullptr});
    }
  }
  return out;
}

ReadOptions PiecesOnly() {
  ReadOptions ro;
  ro.whole_chunks = false;
  return ro;
}

// The filler: reads shards (whole chunks, or batches of pieces in pieces-only mode) in a
// random order forever (until SIGKILL).
[[noreturn]] void RunFiller(const char* dir, const char* seed_text, bool runs) {
  spdlog::set_level(spdlog::level::warn);
  const auto dso = CrashDataset();
  auto ds = MakeSyntheticDataset(dso);
  auto up = std::make_unique<FakeUpstream>();
  up->AddDataset(dso, ds);
  auto cache = CachedSource::Open(CrashCacheOptions(dir), std::move(up));
  if (!cache.ok()) {
    std::fprintf(stderr, "filler: %s\n", cache.status().ToString().c_str());
    std::_Exit(3);
  }
  std::mt19937 rng(static_cast<unsigned>(std::strtoul(seed_text, nullptr, 10)));
  std::vector<uint8_t> buf(8 * (64 << 10));
  while (runs) {
    const uint32_t shard = rng() % dso.shards;
    std::vector<ChunkPiece> pieces = CrashPieces(ds, shard);
    std::shuffle(pieces.begin(), pieces.end(), rng);
    pieces.resize(8);
    for (size_t i = 0; i < pieces.size(); ++i) pieces[i].dest = buf.data() + i * (64 << 10);
    if (!(*cache)->ReadPieces(ds, shard, pieces, PiecesOnly()).ok()) std::_Exit(4);
  }
  while (true) {
    const uint32_t shard = rng() % dso.shards;
    Status s = (*cache)->ReadChunks(ds, shard, 0, dataset::ChunkCount(ds->manifest, shard), ReadOptions(),
                                    [](uint64_t, const ChunkPtr&) { return Status::Ok(); });
    if (!s.ok()) std::_Exit(4);
  }
}

// Runs once main() has started (after every static initializer, protobuf's included).
struct FillerHook : Catch::TestEventListenerBase {
  using TestEventListenerBase::TestEventListenerBase;
  void testRunStarting(const Catch::TestRunInfo&) override {
    const char* dir = std::getenv("SC_CACHE_FILL_DIR");
    const char* seed = std::getenv("SC_CACHE_FILL_SEED");
    const char* mode = std::getenv("SC_CACHE_FILL_MODE");
    if (dir != nullptr) RunFiller(dir, seed != nullptr ? seed : "1", mode != nullptr && std::strcmp(mode, "runs") == 0);
  }
};

// Every piece the runs filler reads, one at a time; returns the pieces served (all verified
// byte for byte here).
uint64_t VerifyRuns(CachedSource& cache, const SyntheticDatasetOptions& dso, const DatasetPtr& ds, uint64_t* wrong) {
  uint64_t served = 0;
  std::vector<uint8_t> got(64 << 10);
  for (uint32_t s = 0; s < dso.shards; ++s) {
    for (ChunkPiece p : CrashPieces(ds, s)) {
      p.dest = got.data();
      ReadOptions ro = PiecesOnly();
      ro.deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
      const Status st = cache.ReadPieces(ds, s, std::span<const ChunkPiece>(&p, 1), ro);
      if (!st.ok()) {
        if (st.code() != StatusCode::kUnavailable) ++*wrong;  // only "not cached" is fine
        continue;
      }
      auto want = MakeSyntheticChunk(dso, ds, s, p.chunk);
      if (std::memcmp(got.data(), want->bytes.data() + p.offset, p.length) != 0) ++*wrong;
      ++served;
    }
  }
  return served;
}

// Reopens with a dead upstream; returns chunks (or pieces) served (all verified byte for byte
// here).
uint64_t VerifyAfterCrash(const std::string& dir, bool runs, uint64_t* wrong) {
  const auto dso = CrashDataset();
  auto ds = MakeSyntheticDataset(dso);
  auto up = std::make_unique<FakeUpstream>();
  up->AddDataset(dso, ds);
  up->fail = true;
  auto opened = CachedSource::Open(CrashCacheOptions(dir), std::move(up));
  REQUIRE(opened.ok());
  auto& cache = *opened;
  if (runs) return VerifyRuns(*cache, dso, ds, wrong);
  uint64_t served = 0;
  for (uint32_t s = 0; s < dso.shards; ++s) {
    for (uint64_t c = 0; c < dataset::ChunkCount(ds->manifest, s); ++c) {
      ReadOptions ro;
      ro.deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
      auto got = cache->ReadChunk(ds, s, c, ro);
      if (!got.ok()) {
        if (got.status().code() != StatusCode::kUnavailable) ++*wrong;  // only "not cached" is fine
        continue;
      }
      auto want = MakeSyntheticChunk(dso, ds, s, c);
      if ((*got)->bytes.size() != want->bytes.size() ||
          std::memcmp((*got)->bytes.data(), want->bytes.data(), want->bytes.size()) != 0) {
        ++*wrong;
      }
      ++served;
    }
  }
  return served;
}

void KillLoop(int iterations, bool runs) {
  TempDir dir;
  const std::string cache_dir = dir / "cache";
  std::mt19937 rng(12345);
  uint64_t total_served = 0;
  uint64_t max_du = 0;
  for (int i = 0; i < iterations; ++i) {
    ::setenv("SC_CACHE_FILL_DIR", cache_dir.c_str(), 1);
    ::setenv("SC_CACHE_FILL_SEED", std::to_string(i).c_str(), 1);
    ::setenv("SC_CACHE_FILL_MODE", runs ? "runs" : "chunks", 1);
    {
      Process filler({"/proc/self/exe"}, dir / "filler.log");
      ::unsetenv("SC_CACHE_FILL_DIR");
      const int kill_after_ms = 150 + static_cast<int>(rng() % 1200);
      std::this_thread::sleep_for(std::chrono::milliseconds(kill_after_ms));
      const uint64_t du_live = DuBytes(cache_dir);
      max_du = std::max(max_du, du_live);
      REQUIRE(filler.Running());  // it must die by our SIGKILL, not on its own
      filler.Kill();
    }
    const uint64_t du_after = DuBytes(cache_dir);
    max_du = std::max(max_du, du_after);
    uint64_t wrong = 0;
    const uint64_t served = VerifyAfterCrash(cache_dir, runs, &wrong);
    INFO("iteration " << i << ": served " << served << " chunks, du " << du_after);
    CHECK(wrong == 0);
    CHECK(du_after <= kCrashBudget);
    CHECK(DuBytes(cache_dir) <= kCrashBudget);
    total_served += served;
  }
  ::unsetenv("SC_CACHE_FILL_SEED");
  ::unsetenv("SC_CACHE_FILL_MODE");
  WARN(iterations << " SIGKILLs: " << total_served << (runs ? " pieces" : " chunks") << " served after restarts, all correct; max du "
                  << max_du << " B of " << kCrashBudget << " B");
  CHECK(total_served > 0);
  CHECK(max_du <= kCrashBudget);
}

}  // namespace

CATCH_REGISTER_LISTENER(FillerHook)

TEST_CASE("crash safety: a filling cache killed with SIGKILL 3 times serves only correct bytes within budget",
          "[cache][crash]") {
  KillLoop(3, false);
}

TEST_CASE("crash safety: a filling cache killed with SIGKILL 20 times in a row serves only correct bytes within budget",
          "[cache][crash][slow]") {
  KillLoop(20, false);
}

TEST_CASE("crash safety: partial chunks (runs) survive 3 SIGKILLs of a filling cache; every piece served is exact",
          "[cache][crash][runs]") {
  KillLoop(3, true);
}

TEST_CASE("crash safety: partial chunks (runs) survive 20 SIGKILLs of a filling cache; every piece served is exact",
          "[cache][crash][runs][slow]") {
  KillLoop(20, true);
}
