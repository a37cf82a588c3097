#include <catch2/catch.hpp>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <thread>

#include <rocksdb/db.h>

#include "daemon/cache/cached_source.h"
#include "daemon/cache/index_db.h"
#include "daemon/cache/segment_file.h"
#include "tests/cache/cache_test_util.h"
#include "tests/cache/fake_upstream.h"
#include "testing/temp_dir.h"

using namespace shardcache;
using namespace shardcache::cache;
using namespace shardcache::testing;

namespace {

std::unique_ptr<CachedSource> OpenCache(const CacheOptions& o, const SyntheticDatasetOptions& dso,
                                        const DatasetPtr& ds, FakeUpstream** up_out) {
  auto up = std::make_unique<FakeUpstream>();
  up->AddDataset(dso, ds);
  *up_out = up.get();
  auto c = CachedSource::Open(o, std::move(up));
  REQUIRE(c.ok());
  return std::move(*c);
}

}  // namespace

TEST_CASE("nvme store: a restarted cache serves from its index without refetching", "[cache][nvme][restart]") {
  TempDir dir;
  SyntheticDatasetOptions dso;
  auto ds = MakeSyntheticDataset(dso);
  const auto o = SmallCacheOptions(dir / "cache");
  FakeUpstream* up = nullptr;
  {
    auto cache = OpenCache(o, dso, ds, &up);
    REQUIRE(cache->OpenDataset(dso.name).ok());
    CHECK(ReadAndCompare(*cache, ds, dso) == 0);
  }  // destructor commits
  auto cache = OpenCache(o, dso, ds, &up);
  auto st = cache->Stats();
  CHECK(st.nvme.entries == 16);
  CHECK(ReadAndCompare(*cache, ds, dso) == 0);
  CHECK(up->chunks_sent.load() == 0);
  CHECK(cache->Stats().hits_nvme == 16);
}

TEST_CASE("nvme store: after a restart with the upstream down, cached datasets are still served",
          "[cache][nvme][restart][faults]") {
  TempDir dir;
  SyntheticDatasetOptions dso;
  auto ds = MakeSyntheticDataset(dso);
  const auto o = SmallCacheOptions(dir / "cache");
  FakeUpstream* up = nullptr;
  {
    auto cache = OpenCache(o, dso, ds, &up);
    REQUIRE(cache->OpenDataset(dso.name).ok());
    REQUIRE(cache->GetSampleIndex(ds, 1).ok());
    CHECK(ReadAndCompare(*cache, ds, dso) == 0);
  }
  auto up2 = std::make_unique<FakeUpstream>();
  up2->fail = true;
  auto opened = CachedSource::Open(o, std::move(up2));
  REQUIRE(opened.ok());
  auto& cache = *opened;
  auto manifest = cache->OpenDataset(dso.name);
  REQUIRE(manifest.ok());
  CHECK((*manifest)->version == ds->version);
  CHECK(cache->GetSampleIndex(*manifest, 1).ok());
  CHECK(ReadAndCompare(*cache, *manifest, dso) == 0);
}

TEST_CASE("nvme store: start-up reads the index, not the segment contents", "[cache][nvme][restart]") {
  TempDir dir;
  SyntheticDatasetOptions dso;
  auto ds = MakeSyntheticDataset(dso);
  const auto o = SmallCacheOptions(dir / "cache");
  FakeUpstream* up = nullptr;
  {
    auto cache = OpenCache(o, dso, ds, &up);
    CHECK(ReadAndCompare(*cache, ds, dso) == 0);
  }
  // Replace every segment by a hole of the same size: a start-up that scanned or verified
  // data would drop the entries; one that reads the index keeps them all.
  int replaced = 0;
  for (uint32_t id = 1; id < 64; ++id) {
    const std::string p = SegmentFile::PathFor(o.dir, id);
    struct ::stat st;
    if (::stat(p.c_str(), &st) != 0) continue;
    REQUIRE(unlink(p.c_str()) == 0);
    int fd = open(p.c_str(), O_CREAT | O_WRONLY, 0644);
    REQUIRE(fd >= 0);
    REQUIRE(ftruncate(fd, st.st_size) == 0);
    close(fd);
    ++replaced;
  }
  REQUIRE(replaced > 0);
  auto cache = OpenCache(o, dso, ds, &up);
  CHECK(cache->Stats().nvme.entries == 16);
  // Recovery read the whole index: RocksDB holds some of it (the block cache at least),
  // bounded by the memtables and block cache IndexDb::Open sizes, plus its table readers.
  CHECK(cache->Stats().nvme.index_memory_bytes > 0);
  CHECK(cache->Stats().nvme.index_memory_bytes < (8u << 20) + o.index_block_cache_bytes + (4u << 20));
  // ...and every read of such an entry is caught by verification, then refetched.
  CHECK(ReadAndCompare(*cache, ds, dso) == 0);
  CHECK(cache->Stats().nvme.checksum_failures == 16);
  CHECK(up->chunks_sent.load() == 16);
}

TEST_CASE("nvme store: entries beyond a segment's durable watermark or in a missing segment are dropped",
          "[cache][nvme][restart]") {
  TempDir dir;
  SyntheticDatasetOptions dso;
  auto ds = MakeSyntheticDataset(dso);
  const auto o = SmallCacheOptions(dir / "cache");
  FakeUpstream* up = nullptr;
  {
    auto cache = OpenCache(o, dso, ds, &up);
    CHECK(ReadAndCompare(*cache, ds, dso) == 0);
  }
  {
    // Forge what a crash between "append" and "commit" would look like if the index were
    // written first: an entry past the watermark of segment 1, and one in a segment that
    // has no file.
    auto db = IndexDb::Open(o.dir + "/index", 1 << 20);
    REQUIRE(db.ok());
    EntryRecord rec;
    rec.length = 4096;
    rec.chunk = 999;
    std::vector<EntryPut> puts = {EntryPut{1, 4ull << 20, rec}, EntryPut{777, 0, rec}};
    REQUIRE((*db)->Commit(puts, {}, true).ok());
  }
  auto cache = OpenCache(o, dso, ds, &up);
  CHECK(cache->Stats().nvme.entries == 16);
  CHECK(ReadAndCompare(*cache, ds, dso) == 0);
  CHECK(up->chunks_sent.load() == 0);
}

TEST_CASE("nvme store: a corrupt byte in a segment is detected, dropped, refetched and never served",
          "[cache][nvme][faults]") {
  TempDir dir;
  SyntheticDatasetOptions dso;
  auto ds = MakeSyntheticDataset(dso);
  const auto o = SmallCacheOptions(dir / "cache");
  FakeUpstream* up = nullptr;
  auto cache = OpenCache(o, dso, ds, &up);
  CHECK(ReadAndCompare(*cache, ds, dso) == 0);
  cache->Flush();
  // Flip one byte in the middle of the first segment (the first chunk stored).
  const std::string seg = SegmentFile::PathFor(o.dir, 1);
  int fd = open(seg.c_str(), O_RDWR);
  REQUIRE(fd >= 0);
  uint8_t b = 0;
  REQUIRE(pread(fd, &b, 1, 12345) == 1);
  b ^= 0xff;
  REQUIRE(pwrite(fd, &b, 1, 12345) == 1);
  fsync(fd);
  close(fd);
  // Drop the page cache copy so the O_DIRECT read sees the disk (O_DIRECT reads bypass it anyway).
  const uint64_t before = up->chunks_sent.load();
  CHECK(ReadAndCompare(*cache, ds, dso) == 0);  // every delivered byte is right
  CHECK(cache->Stats().nvme.checksum_failures == 1);
  CHECK(up->chunks_sent.load() == before + 1);  // exactly the corrupt chunk was refetched
  cache->Flush();
  CHECK(ReadAndCompare(*cache, ds, dso) == 0);
  CHECK(cache->Stats().nvme.checksum_failures == 1);
}

TEST_CASE("nvme store: the byte budget is never exceeded while filling past it, measured with du",
          "[cache][nvme][budget]") {
  TempDir dir;
  SyntheticDatasetOptions dso;
  dso.shards = 12;  // 96 MiB through a 32 MiB cache
  auto ds = MakeSyntheticDataset(dso);
  const uint64_t budget = 32ull << 20;
  const auto o = SmallCacheOptions(dir / "cache", budget);
  FakeUpstream* up = nullptr;
  auto cache = OpenCache(o, dso, ds, &up);
  std::atomic<bool> done{false};
  std::atomic<uint64_t> max_du{0};
  std::thread watcher([&] {
    while (!done) {
      const uint64_t d = DuBytes(o.dir);
      if (d > max_du) max_du = d;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  });
  CHECK(ReadAndCompare(*cache, ds, dso) == 0);
  cache->Flush();
  done = true;
  watcher.join();
  const auto st = cache->Stats();
  const uint64_t du = DuBytes(o.dir);
  INFO("max du " << max_du.load() << " final du " << du << " segments " << st.nvme.segments
                 << " index " << st.nvme.index_bytes);
  CHECK(max_du.load() <= budget);
  CHECK(du <= budget);
  CHECK(st.nvme.evicted_segments > 0);
  // Overhead beyond the segments: the index directory and two directory inodes.
  CHECK(du - st.nvme.segment_allocated_bytes < (1ull << 20));
  WARN("budget " << budget << " B: max du during fill " << max_du.load() << " B, segments "
                 << st.nvme.segment_allocated_bytes << " B, overhead (index + dirs) "
                 << du - st.nvme.segment_allocated_bytes << " B");
}

TEST_CASE("nvme store: a successor waits for the index LOCK its stopping predecessor still holds",
          "[cache][nvme][restart]") {
  testing::TempDir tmp;
  const std::string path = tmp.path() + "/index";
  auto first = IndexDb::Open(path, 1 << 20);
  REQUIRE(first.ok());
  // The predecessor lets go after 400 ms (it finished stopping); the successor started before.
  std::thread stopping([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(400));
    first->reset();
  });
  const auto t0 = std::chrono::steady_clock::now();
  auto second = IndexDb::Open(path, 1 << 20);
  stopping.join();
  INFO((second.ok() ? "" : second.status().ToString()));
  REQUIRE(second.ok());
  CHECK(std::chrono::steady_clock::now() - t0 >= std::chrono::milliseconds(300));
}

TEST_CASE("nvme store: an index that cannot be read is set aside with an error and the cache starts empty",
          "[cache][nvme][restart][faults]") {
  // Corruption of the index's files (30 bytes flipped across them, as a failing disk would), or
  // an index of another format, once stopped the daemon from starting: a restart loop under
  // systemd for what is only a cache.
  const auto corruption = GENERATE(0, 1);
  TempDir dir;
  SyntheticDatasetOptions dso;
  auto ds = MakeSyntheticDataset(dso);
  const auto o = SmallCacheOptions(dir / "cache");
  FakeUpstream* up = nullptr;
  {
    auto cache = OpenCache(o, dso, ds, &up);
    REQUIRE(ReadAndCompare(*cache, ds, dso) == 0);
  }
  const std::string index = o.dir + "/index";
  if (corruption == 0) {
    std::vector<std::string> files;
    for (const auto& e : std::filesystem::directory_iterator(index)) {
      if (e.is_regular_file() && e.file_size() > 0) files.push_back(e.path());
    }
    std::sort(files.begin(), files.end());
    uint64_t seed = 7;
    for (int k = 0; k < 30; ++k) {
      seed = seed * 6364136223846793005ull + 1442695040888963407ull;
      const std::string& f = files[(seed >> 33) % files.size()];
      const auto size = std::filesystem::file_size(f);
      UniqueFd fd(::open(f.c_str(), O_RDWR));
      REQUIRE(fd.valid());
      const off_t at = static_cast<off_t>((seed >> 13) % size);
      uint8_t b = 0;
      REQUIRE(::pread(fd.get(), &b, 1, at) == 1);
      b ^= 0xff;
      REQUIRE(::pwrite(fd.get(), &b, 1, at) == 1);
    }
  } else {
    // A future build's format version (IndexDb keeps it under key "F").
    rocksdb::DB* raw = nullptr;
    REQUIRE(rocksdb::DB::Open(rocksdb::Options(), index, &raw).ok());
    REQUIRE(raw->Put(rocksdb::WriteOptions(), "F", "999").ok());
    delete raw;
  }
  auto cache = OpenCache(o, dso, ds, &up);  // REQUIREs that it opens
  CHECK(cache->Stats().nvme.entries == 0);
  const uint64_t before = up->chunks_sent.load();
  CHECK(ReadAndCompare(*cache, ds, dso) == 0);  // refetched, every byte right
  CHECK(up->chunks_sent.load() > before);
  // The unreadable index is kept beside the new one for diagnosis.
  int aside = 0;
  for (const auto& e : std::filesystem::directory_iterator(o.dir)) {
    aside += e.path().filename().string().rfind("index.unreadable-", 0) == 0;
  }
  CHECK(aside == 1);
}
