// Disk full caused from outside: the cache lives on a small tmpfs; another file eats the free
// space; reads must keep returning correct bytes (evict + retry, then pass-through without
// storing), the cache must stay within budget, and storing resumes once space returns.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>

#include "daemon/cache/cached_source.h"
#include "tests/cache/cache_test_util.h"
#include "tests/cache/fake_upstream.h"
#include "testing/temp_dir.h"

using namespace shardcache;
using namespace shardcache::cache;
using namespace shardcache::testing;

namespace {

class TmpfsMount {
 public:
  TmpfsMount(const std::string& path, uint64_t bytes) : path_(path) {
    ::mkdir(path.c_str(), 0755);
    const std::string opts = "size=" + std::to_string(bytes);
    mounted_ = ::mount("tmpfs", path.c_str(), "tmpfs", 0, opts.c_str()) == 0;
    if (!mounted_) error_ = std::strerror(errno);
  }
  ~TmpfsMount() {
    if (mounted_) ::umount2(path_.c_str(), MNT_DETACH);
  }
  bool mounted() const { return mounted_; }
  const std::string& error() const { return error_; }

 private:
  std::string path_;
  bool mounted_ = false;
  std::string error_;
};

// Writes zeros to `path` until the file system is full; returns bytes written.
uint64_t FillUntilFull(const std::string& path) {
  int fd = ::open(path.c_str(), O_CREAT | O_WRONLY | O_TRUNC, 0644);
  REQUIRE(fd >= 0);
  std::vector<char> buf(64 << 10, 0);
  uint64_t total = 0;
  while (true) {
    ssize_t n = ::write(fd, buf.data(), buf.size());
    if (n <= 0) break;
    total += static_cast<uint64_t>(n);
  }
  ::close(fd);
  return total;
}

}  // namespace

TEST_CASE("disk full from outside: the cache evicts and retries, then passes through without storing",
          "[cache][faults][enospc]") {
  TempDir dir;
  TmpfsMount fs(dir / "fs", 40ull << 20);
  if (!fs.mounted()) {
    WARN("cannot mount a tmpfs here (" << fs.error() << "); ENOSPC test not run");
    return;
  }
  SyntheticDatasetOptions dso;
  dso.shards = 6;  // 48 MiB of 1 MiB chunks
  auto ds = MakeSyntheticDataset(dso);
  auto up = std::make_unique<FakeUpstream>();
  up->AddDataset(dso, ds);
  FakeUpstream* upstream = up.get();
  // The budget (64 MiB) is larger than the file system (40 MiB): the disk fills first.
  auto o = SmallCacheOptions(dir / "fs/cache", 64ull << 20);
  auto opened = CachedSource::Open(o, std::move(up));
  REQUIRE(opened.ok());
  auto& cache = *opened;

  // Fill part of the cache, then let another file take every free byte.
  for (uint32_t s = 0; s < 2; ++s) {
    REQUIRE(cache->ReadChunks(ds, s, 0, 8, ReadOptions(), [](uint64_t, const ChunkPtr&) { return Status::Ok(); }).ok());
  }
  cache->Flush();
  const uint64_t cached_before = cache->Stats().nvme.entries;
  CHECK(cached_before == 16);
  const uint64_t hog = FillUntilFull(dir / "fs/hog");
  INFO("hog took " << hog << " bytes");

  // Step 1: the cache gives its own segments back to make room (evict and retry); every read
  // still returns correct bytes and the budget holds.
  CHECK(ReadAndCompare(*cache, ds, dso) == 0);
  cache->Flush();
  auto st = cache->Stats();
  CHECK(st.nvme.evicted_segments > 0);
  CHECK(DuBytes(o.dir) <= o.size_bytes);

  // Step 2: with nothing of its own left to give back, chunks pass through without storing.
  REQUIRE(cache->Evict(dso.name).ok());
  FillUntilFull(dir / "fs/hog2");
  CHECK(ReadAndCompare(*cache, ds, dso) == 0);
  cache->Flush();
  st = cache->Stats();
  WARN("disk full: " << st.nvme.evicted_segments << " segments evicted, " << st.nvme.enospc_passthrough
                     << " chunks passed through without storing");
  CHECK(st.nvme.enospc_passthrough > 0);
  CHECK(st.nvme.entries == 0);
  CHECK(DuBytes(o.dir) <= o.size_bytes);

  // Space comes back: storing resumes (after the 1 s back-off).
  REQUIRE(::unlink((dir / "fs/hog").c_str()) == 0);
  REQUIRE(::unlink((dir / "fs/hog2").c_str()) == 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  CHECK(ReadAndCompare(*cache, ds, dso) == 0);
  cache->Flush();
  CHECK(cache->Stats().nvme.entries > 0);
  const uint64_t fetched = upstream->chunks_sent.load();
  CHECK(ReadAndCompare(*cache, ds, dso) == 0);
  CHECK(upstream->chunks_sent.load() - fetched < 48);  // some of it is served from the cache again
}
