// The index builder: from a dataset's shards (shard_discovery.h) to its manifest and sample
// indexes, wherever the shards' bytes are. A ShardStore reads them — files of a directory
// (indexer.h) or objects of a bucket, with ranged reads (object_indexer.h) — and BuildIndex
// builds each shard's sample index, hashes every chunk on `options.threads` workers and
// serializes the results. It writes nothing itself: the caller stores the sample indexes (and
// any block tables handed to its BlockTableSink) first and the manifest last, so no reader sees
// a manifest whose sample indexes are missing. The same shards give byte-identical output from
// any store.
//
// Thread safety: BuildIndex calls the store from many threads at once; a ShardStore's methods
// must be safe for that. `options.progress` is called only on the calling thread.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string_view>
#include <string>
#include <vector>

#include "common/status.h"
#include "dataset/byte_source.h"
#include "dataset/indexer.h"
#include "dataset/shard_discovery.h"

namespace shardcache::dataset {

class ShardStore {
 public:
  virtual ~ShardStore() = default;
  // How messages name the file at relative path `rel`: "DIR/rel", "s3://bucket/prefix/rel".
  virtual std::string Describe(const std::string& rel) const = 0;
  // Random access to the shard's bytes (tar parsing). FailedPrecondition naming it when its size
  // is no longer shard.size_bytes.
  virtual Result<std::unique_ptr<ByteSource>> OpenShard(const ShardEntry& shard) const = 0;
  // Exactly `length` bytes at `offset` of the shard into `buf` (chunk hashing). An error names
  // the shard: DataLoss when it shrank, FailedPrecondition when an object changed.
  virtual Status ReadShard(const ShardEntry& shard, uint64_t offset, uint64_t length, char* buf) const = 0;
  // The whole of shard.companion_path (a megatron .idx).
  virtual Result<std::string> ReadCompanion(const ShardEntry& shard) const = 0;
};

// What the indexer stores: <root>/.shardcache/samples/<i>.pb and <root>/.shardcache/manifest.pb
// (and the block tables, written through a BlockTableSink while the chunks are hashed).
struct BuiltIndex {
  std::string manifest_bytes;
  std::vector<std::string> sample_indexes;  // serialized, by shard number
};

// Receives each chunk's block table (common/hash.h) as it is hashed, from the hashing threads
// (several at once, never twice for one chunk): `shard` is the position in BuildIndex's `shards`.
using BlockTableSink = std::function<Status(size_t shard, uint64_t chunk, std::string_view table)>;

// InvalidArgument for a chunk size outside [kMinChunkBytes, kMaxChunkBytes] or records without a
// record size; shared by every indexer so they refuse the same options with the same words.
Status CheckIndexOptions(const IndexOptions& options);

// Builds the index of `shards` (non-empty, sorted as SelectShards returns them) read through
// `store`, for a manifest named `name` (already checked). options.name is ignored. Errors name
// the shard (and offset where one applies): InvalidArgument for a shard that does not fit the
// format, DataLoss for corrupt shards, what the store returns for failed reads.
// `tables`, when set, gets every chunk's block table; its error ends the build.
Result<BuiltIndex> BuildIndex(const ShardStore& store, const std::vector<ShardEntry>& shards,
                              const std::string& name, const IndexOptions& options,
                              const BlockTableSink& tables = {});

}  // namespace shardcache::dataset
