#include <cstdlib>
#include <cstring>
#include "tests/cache/cache_test_util.h"
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

}  // namespace shardcache::testing
