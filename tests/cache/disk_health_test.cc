// A cache disk that is lost, failing, too small or not mounted: the NVMe tier says so (health,
// one log line per change, shardcache_cache_nvme_healthy), keeps serving correct bytes without
// storing, and stores again once the disk is back. Also the rules at open: require_mount, a
// budget larger than the file system, chunks larger than a segment.
#include <catch2/catch.hpp>

#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <memory>
#include <sstream>
#include <thread>

#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include "common/metrics.h"
#include "daemon/cache/cached_source.h"
#include "daemon/cache/disk_health.h"
#include "tests/cache/cache_test_util.h"
#include "tests/cache/fake_upstream.h"
#include "testing/eventually.h"
#include "testing/temp_dir.h"

using namespace shardcache;
using namespace shardcache::cache;
using namespace shardcache::testing;

namespace {

// Collects what spdlog's default logger writes while it lives.
class LogCapture {
 public:
  LogCapture() : sink_(std::make_shared<spdlog::sinks::ostream_sink_mt>(out_)) {
    sink_->set_pattern("[%l] %v");
    spdlog::default_logger()->sinks().push_back(sink_);
  }
  ~LogCapture() {
    auto& sinks = spdlog::default_logger()->sinks();
    sinks.erase(std::remove(sinks.begin(), sinks.end(), sink_), sinks.end());
  }
  // Lines containing `text`.
  int Count(const std::string& text) {
    std::istringstream in(Text());
    int n = 0;
    for (std::string line; std::getline(in, line);) n += line.find(text) != std::string::npos;
    return n;
  }
  std::string Text() {
    sink_->flush();
    return out_.str();
  }

 private:
  std::ostringstream out_;
  std::shared_ptr<spdlog::sinks::ostream_sink_mt> sink_;
};

double Metric(const std::string& name, const metrics::Labels& labels = {}) {
  return metrics::Registry::Global().ValueOf(name, labels);
}

std::unique_ptr<CachedSource> OpenCache(const CacheOptions& o, const SyntheticDatasetOptions& dso,
                                        const DatasetPtr& ds) {
  auto up = std::make_unique<FakeUpstream>();
  up->AddDataset(dso, ds);
  auto c = CachedSource::Open(o, std::move(up));
  REQUIRE(c.ok());
  return std::move(*c);
}

Status ReadShard(CachedSource& cache, const DatasetPtr& ds, uint32_t shard) {
  return cache.ReadChunks(ds, shard, 0, dataset::ChunkCount(ds->manifest, shard), ReadOptions(),
                          [](uint64_t, const ChunkPtr&) { return Status::Ok(); });
}


}  // namespace

TEST_CASE("a cache directory taken away is reported once, chunks pass through, and storing resumes when it is back",
          "[cache][faults][disk]") {
  TempDir dir;
  SyntheticDatasetOptions dso;  // 2 shards of 8 chunks
  auto ds = MakeSyntheticDataset(dso);
  const auto o = SmallCacheOptions(dir / "cache");
  auto cache = OpenCache(o, dso, ds);
  REQUIRE(ReadShard(*cache, ds, 0).ok());
  cache->Flush();
  REQUIRE(cache->Stats().nvme.entries == 8);
  CHECK(Metric("shardcache_cache_nvme_healthy") == 1);

  LogCapture log;
  const double unstored_before = Metric("shardcache_cache_unstored_chunks_total", {{"reason", "disk_failing"}});
  // The disk goes away under the running store (as an unmount or a lost device looks from here).
  std::filesystem::rename(dir / "cache", dir / "moved");
  REQUIRE(Eventually([&] { return !cache->disk_problem().empty(); }, std::chrono::seconds(5)));
  INFO(log.Text());
  CHECK_THAT(cache->disk_problem(), Catch::Contains("gone"));
  CHECK(Metric("shardcache_cache_nvme_healthy") == 0);
  CHECK_THAT(cache->Stats().nvme.disk_problem, Catch::Contains("gone"));

  // Every byte is still served: shard 0 from the segments the store holds open, shard 1 from
  // upstream without storing it.
  CHECK(ReadAndCompare(*cache, ds, dso) == 0);
  cache->Flush();
  CHECK(cache->Stats().nvme.entries == 8);
  CHECK(Metric("shardcache_cache_unstored_chunks_total", {{"reason", "disk_failing"}}) - unstored_before == 8);
  // Several probes later: still one error line (the old store warned once a second).
  std::this_thread::sleep_for(std::chrono::milliseconds(2500));
  CHECK(log.Count("[error] cache disk " + o.dir + ": the cache directory is gone") == 1);

  std::filesystem::rename(dir / "moved", dir / "cache");
  REQUIRE(Eventually([&] { return cache->disk_problem().empty(); }, std::chrono::seconds(5)));
  CHECK(Metric("shardcache_cache_nvme_healthy") == 1);
  CHECK(log.Count("[warning] cache disk " + o.dir + ": usable again") == 1);
  REQUIRE(ReadShard(*cache, ds, 1).ok());
  cache->Flush();
  CHECK(cache->Stats().nvme.entries == 16);
}

TEST_CASE("an I/O error marks the disk failing until a probe can write to it again", "[cache][faults][disk]") {
  TempDir dir;
  LogCapture log;
  auto health = DiskHealth::Open(dir.path());
  REQUIRE(health.ok());
  DiskHealth& h = **health;
  CHECK(h.healthy());
  const double errors_before = Metric("shardcache_cache_nvme_errors_total");
  h.ReportIoError(ErrnoStatus(EIO, "write seg-00000001.dat"));
  h.ReportIoError(ErrnoStatus(EIO, "write seg-00000002.dat"));
  CHECK_FALSE(h.healthy());
  CHECK_THAT(h.problem(), Catch::Contains("I/O error") && Catch::Contains("seg-00000002.dat"));
  CHECK(Metric("shardcache_cache_nvme_errors_total") - errors_before == 2);
  CHECK(log.Count("[error] cache disk") == 1);
  h.Probe(/*room_for_segment=*/true);  // the probe file can be written: the disk works again
  CHECK(h.healthy());
  CHECK(log.Count("[warning] cache disk") == 1);
  CHECK_FALSE(std::filesystem::exists(dir / ".health-probe"));
}

TEST_CASE("running out of space is a failure only once it lasts, and ends when there is room", "[cache][faults][disk]") {
  TempDir dir;
  auto health = DiskHealth::Open(dir.path(), std::chrono::seconds(0));
  REQUIRE(health.ok());
  DiskHealth& h = **health;
  h.ReportNoSpace("a new 4 MiB segment");
  CHECK_FALSE(h.healthy());
  CHECK_THAT(h.problem(), Catch::Contains("free-space floor"));
  h.Probe(/*room_for_segment=*/false);
  CHECK_FALSE(h.healthy());
  h.Probe(/*room_for_segment=*/true);
  CHECK(h.healthy());

  auto patient = DiskHealth::Open(dir.path(), std::chrono::seconds(60));
  REQUIRE(patient.ok());
  (*patient)->ReportNoSpace("a new 4 MiB segment");
  CHECK((*patient)->healthy());  // a moment of ENOSPC: the store evicts and retries
}

TEST_CASE("a chunk larger than a segment is counted and its dataset named, not silently dropped",
          "[cache][nvme]") {
  TempDir dir;
  SyntheticDatasetOptions dso;  // 1 MiB chunks: with their block table, more than a 1 MiB segment
  dso.name = "big-chunks";
  auto ds = MakeSyntheticDataset(dso);
  auto o = SmallCacheOptions(dir / "cache");
  o.segment_bytes = 1ull << 20;
  LogCapture log;
  auto cache = OpenCache(o, dso, ds);
  REQUIRE(cache->OpenDataset(dso.name).ok());
  const metrics::Labels too_large = {{"reason", "larger_than_segment"}};
  const double before = std::max(0.0, Metric("shardcache_cache_unstored_chunks_total", too_large));
  CHECK(ReadAndCompare(*cache, ds, dso) == 0);
  cache->Flush();
  CHECK(cache->Stats().nvme.entries == 0);
  CHECK(Metric("shardcache_cache_unstored_chunks_total", too_large) - before == 16);
  INFO(log.Text());
  CHECK(log.Count("dataset 'big-chunks' has 1.00 MiB chunks, which do not fit a 1.00 MiB segment") == 1);
}

TEST_CASE("require_mount refuses a directory that is not a mount point and never creates a missing one",
          "[cache][mount]") {
  TempDir dir;
  SyntheticDatasetOptions dso;
  auto ds = MakeSyntheticDataset(dso);
  auto o = SmallCacheOptions(dir / "plain");
  o.require_mount = true;
  REQUIRE(MakeDirs(o.dir).ok());
  auto plain = CachedSource::Open(o, std::make_unique<FakeUpstream>());
  REQUIRE_FALSE(plain.ok());
  CHECK(plain.status().code() == StatusCode::kFailedPrecondition);
  CHECK_THAT(plain.status().message(), Catch::Contains("cache.dir " + o.dir) && Catch::Contains("require_mount"));

  o.dir = dir / "absent";
  auto absent = CachedSource::Open(o, std::make_unique<FakeUpstream>());
  REQUIRE_FALSE(absent.ok());
  CHECK_THAT(absent.status().message(), Catch::Contains("does not exist") && Catch::Contains("mount the cache disk"));
  CHECK_FALSE(std::filesystem::exists(o.dir));  // the old store created it on whatever lay below

  TmpfsMount disk(dir / "disk", 64ull << 20);
  if (!disk.mounted()) {
    WARN("cannot mount a tmpfs here (" << disk.error() << "); the accepted case is not run");
    return;
  }
  o.dir = dir / "disk";
  auto mounted = CachedSource::Open(o, std::make_unique<FakeUpstream>());
  INFO(mounted.status().ToString());
  CHECK(mounted.ok());
}

TEST_CASE("a budget larger than the file system is fitted to it, and both figures are reported", "[cache][nvme]") {
  TempDir dir;
  auto o = SmallCacheOptions(dir / "cache", 1ull << 50);  // 1 PiB
  o.min_free = {0.05, 0};
  LogCapture log;
  auto cache = OpenCache(o, SyntheticDatasetOptions(), MakeSyntheticDataset(SyntheticDatasetOptions()));
  struct statvfs vfs;
  REQUIRE(statvfs(o.dir.c_str(), &vfs) == 0);
  const uint64_t fs_bytes = static_cast<uint64_t>(vfs.f_blocks) * vfs.f_frsize;
  const auto st = cache->Stats();
  CHECK(st.nvme.size_bytes == fs_bytes - static_cast<uint64_t>(0.05 * static_cast<double>(fs_bytes)));
  CHECK(st.nvme.configured_size_bytes == 1ull << 50);
  CHECK(Metric("shardcache_cache_nvme_budget_bytes") == static_cast<double>(st.nvme.size_bytes));
  INFO(log.Text());
  CHECK(log.Count("[warning] cache.size 1.00 PiB is more than the file system of " + o.dir + " can hold") == 1);
  // A reload asking for more is fitted too.
  REQUIRE(cache->SetSizeBytes(1ull << 51).ok());
  CHECK(cache->Stats().nvme.size_bytes == st.nvme.size_bytes);
  CHECK(cache->Stats().nvme.configured_size_bytes == 1ull << 51);
}
