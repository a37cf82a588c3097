#include "tests/cache/cache_test_util.h"

#include <sys/mount.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "tests/testing/process.h"

namespace shardcache::testing {

uint64_t DuBytes(const std::string& dir) {
  std::string out;
  if (RunCommand("du -sB1 '" + dir + "' 2>/dev/null", &out) != 0 && out.empty()) return 0;
  return std::strtoull(out.c_str(), nullptr, 10);
}

uint64_t ReadAndCompare(ChunkSource& source, const DatasetPtr& dataset, const SyntheticDatasetOptions& options,
                        uint64_t* errors) {
  uint64_t bad = 0;
  for (uint32_t s = 0; s < static_cast<uint32_t>(dataset->manifest.shards_size()); ++s) {
    const uint64_t n = dataset::ChunkCount(dataset->manifest, s);
    Status st = source.ReadChunks(dataset, s, 0, n, ReadOptions(), [&](uint64_t c, const ChunkPtr& chunk) {
      auto want = MakeSyntheticChunk(options, dataset, s, c);
      if (chunk->bytes.size() != want->bytes.size() ||
          std::memcmp(chunk->bytes.data(), want->bytes.data(), want->bytes.size()) != 0) {
        ++bad;
      }
      return Status::Ok();
    });
    if (!st.ok()) {
      if (errors) ++*errors;
      ++bad;
    }
  }
  return bad;
}

TmpfsMount::TmpfsMount(const std::string& path, uint64_t bytes) : path_(path) {
  ::mkdir(path.c_str(), 0755);
  const std::string opts = "size=" + std::to_string(bytes);
  mounted_ = ::mount("tmpfs", path.c_str(), "tmpfs", 0, opts.c_str()) == 0;
  if (!mounted_) error_ = std::strerror(errno);
}

TmpfsMount::~TmpfsMount() {
  if (mounted_) ::umount2(path_.c_str(), MNT_DETACH);
}

}  // namespace shardcache::testing
