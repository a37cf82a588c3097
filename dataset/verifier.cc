#include "dataset/verifier.h"

#include <fcntl.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <vector>

#include "common/fs.h"
#include "common/hash.h"
#include "dataset/parallel_for.h"

namespace shardcache::dataset {

Status VerifyDatasetDir(const std::string& dir, const Dataset& dataset,
                        const VerifyOptions& options) {
  const v1::Manifest& m = dataset.manifest;
  for (int i = 0; i < m.shards_size(); ++i) {
    SC_RETURN_IF_ERROR(LoadSampleIndex(dir, m, static_cast<uint32_t>(i)).status());
  }
  std::vector<uint64_t> chunk_start(static_cast<size_t>(m.shards_size()) + 1, 0);
  uint64_t total_bytes = 0;
  for (int i = 0; i < m.shards_size(); ++i) {
    chunk_start[i + 1] = chunk_start[i] + ChunkCount(m, static_cast<uint32_t>(i));
    total_bytes += m.shards(i).size_bytes();
  }
  std::atomic<uint64_t> done_bytes{0};
  auto check = [&](uint64_t global) -> Status {
    const uint32_t shard = static_cast<uint32_t>(
        std::upper_bound(chunk_start.begin(), chunk_start.end(), global) - chunk_start.begin() - 1);
    const uint64_t chunk = global - chunk_start[shard];
    const uint64_t offset = chunk * m.chunk_bytes();
    const uint64_t length = ChunkLength(m, shard, chunk);
    const std::string path = dir + "/" + m.shards(static_cast<int>(shard)).path();
    thread_local std::unique_ptr<char[]> buf;
    thread_local uint64_t buf_bytes = 0;
    if (buf_bytes < length) {
      buf.reset(new char[length]);
      buf_bytes = length;
    }
    SC_ASSIGN_OR_RETURN(UniqueFd fd, OpenFile(path, O_RDONLY));
    Status s = PreadFull(fd.get(), buf.get(), length, offset, path);
    if (!s.ok()) return DataLoss(s.message());
    if (ChunkDigest(buf.get(), length) != ChunkHash(m, shard, chunk)) {
      return DataLoss(path + ": chunk " + std::to_string(chunk) + " (bytes " +
                      std::to_string(offset) + ".." + std::to_string(offset + length) +
                      ") does not match its hash in the manifest; the file changed after "
                      "indexing");
    }
    done_bytes.fetch_add(length, std::memory_order_relaxed);
    return Status::Ok();
  };
  std::function<void()> tick;
  if (options.progress) {
    tick = [&] { options.progress(done_bytes.load(std::memory_order_relaxed), total_bytes); };
  }
  return ParallelFor(chunk_start.back(), options.threads, check, tick);
}

}  // namespace shardcache::dataset
