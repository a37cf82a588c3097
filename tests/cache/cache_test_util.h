// Helpers shared by the cache tests: small cache options, `du` of a directory, reading a
// whole dataset through a ChunkSource and checking every byte, a tmpfs to fill or to mount.
#pragma once

#include <cstdint>
#include <string>

#include "daemon/cache/cache_options.h"
#include "daemon/source/chunk_source.h"
#include "tests/cache/fake_upstream.h"

namespace shardcache::testing {

// Small segments (4 MiB), no DRAM tier (so reads exercise NVMe), no free-space floor.
inline cache::CacheOptions SmallCacheOptions(const std::string& dir, uint64_t size_bytes = 48ull << 20) {
  cache::CacheOptions o;
  o.dir = dir;
  o.size_bytes = size_bytes;
  o.memory_bytes = 0;
  o.segment_bytes = 4ull << 20;
  o.index_reserve_bytes = 4ull << 20;
  o.min_free = {0, 0};
  o.commit_interval_ms = 20;
  return o;
}

// Allocated bytes under `dir` as `du -sB1` reports them.
uint64_t DuBytes(const std::string& dir);

// Reads every chunk of `dataset` through `source` and compares it with the synthetic bytes.
// Returns the number of chunks that differ (or failed to read, counted in *errors).
uint64_t ReadAndCompare(ChunkSource& source, const DatasetPtr& dataset, const SyntheticDatasetOptions& options,
                        uint64_t* errors = nullptr);

// A tmpfs of `bytes` mounted at `path` (created when missing) while it lives; this needs root.
// mounted() is false, with the reason in error(), where mounting is not allowed.
class TmpfsMount {
 public:
  TmpfsMount(const std::string& path, uint64_t bytes);
  ~TmpfsMount();  // lazy unmount
  TmpfsMount(const TmpfsMount&) = delete;
  TmpfsMount& operator=(const TmpfsMount&) = delete;
  bool mounted() const { return mounted_; }
  const std::string& error() const { return error_; }

 private:
  std::string path_;
  bool mounted_ = false;
  std::string error_;
};

}  // namespace shardcache::testing
