// The indexer: turns a directory of shard files into a dataset — finds the shards, builds each
// shard's sample index, hashes every chunk with xxh3-128 on all cores, and writes
// DIR/.shardcache/samples/<i>.pb then DIR/.shardcache/manifest.pb (each with WriteFileAtomic,
// manifest last, so a crash mid-index leaves the previous manifest or none, never one that
// points at missing sample indexes). Used by `shardctl index`, `shardctl pack` and tests.
//
// Shard discovery (which files are shards, per format) is shard_discovery.h's, and building the
// index from them index_builder.h's, both shared with the bucket indexer (object_indexer.h).
//
// Thread safety: IndexDirectory may run concurrently on different directories. `progress` is
// called only on the calling thread.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "common/status.h"
#include "dataset/manifest.h"

namespace shardcache::dataset {

struct IndexOptions {
  // Dataset name written to the manifest: trailing components of the directory's path
  // ("train" or "laion/train" for /srv/data/laion/train), the names it can be served under
  // (dataset_name.h); anything else is InvalidArgument. Default: the directory's basename.
  std::string name;
  v1::ShardFormat format = v1::RECORDS;
  // RECORDS only: bytes per record. Required for records.
  uint64_t record_bytes = 0;
  // Transfer/cache/verification unit, within [kMinChunkBytes, kMaxChunkBytes].
  uint64_t chunk_bytes = kDefaultChunkBytes;
  // Worker threads for sample indexes and hashing; 0 = all cores.
  unsigned threads = 0;
  // Called about every 100 ms while hashing, and once at the end with done == total.
  std::function<void(uint64_t done_bytes, uint64_t total_bytes)> progress;
};

// Indexes `dir` and returns the dataset loaded back from what was written. Errors name the file
// (and offset where one applies): InvalidArgument for bad options or a shard that does not fit
// the format, DataLoss for corrupt shards, NotFound when no shard is found.
Result<DatasetPtr> IndexDirectory(const std::string& dir, const IndexOptions& options);

// "records" | "tar" | "megatron" → format; InvalidArgument otherwise.
Result<v1::ShardFormat> ParseShardFormat(const std::string& text);
const char* ShardFormatName(v1::ShardFormat format);

}  // namespace shardcache::dataset
