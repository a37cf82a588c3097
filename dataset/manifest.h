// The dataset manifest: the immutable description of one dataset (format, chunk size, shards,
// per-chunk xxh3-128 hashes, sample counts) that origin, node daemons, clients and the CLI
// agree on. Layout on disk and format history are documented in proto/shardcache/manifest.proto.
//
// A dataset's *version* is the hex xxh3-128 of the manifest file's exact bytes; every cache key
// includes it, so a re-indexed dataset never hits stale cache entries.
//
// Thread safety: free functions on values; a loaded Dataset is immutable and shared freely.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "common/hash.h"
#include "common/status.h"
#include "shardcache/manifest.pb.h"

namespace shardcache::dataset {

// 2: chunk hashes are Merkle roots over kChunkBlockBytes blocks (manifest.proto's history).
constexpr uint32_t kManifestFormatVersion = 2;
constexpr uint32_t kSampleIndexFormatVersion = 1;
constexpr char kMetaDirName[] = ".shardcache";
constexpr uint64_t kDefaultChunkBytes = 4ull << 20;
constexpr uint64_t kMinChunkBytes = 4096;
// Chunks travel as single gRPC messages; keep them well under the 64 MiB message cap.
constexpr uint64_t kMaxChunkBytes = 32ull << 20;

// "<dir>/.shardcache/manifest.pb"
std::string ManifestPath(const std::string& dataset_dir);
// "<dir>/.shardcache/samples/<shard>.pb"
std::string SampleIndexPath(const std::string& dataset_dir, uint32_t shard);
// "<dir>/.shardcache/blocks/<shard>.bin": the block tables (common/hash.h) of the shard's chunks,
// chunk c's at c x BlockTableStride(chunk_bytes), so that a block range is served without
// reading and hashing its whole chunk. Optional: a reader checks each table against the
// manifest's chunk hash and computes the table itself when the file is absent or disagrees.
std::string BlockTablesPath(const std::string& dataset_dir, uint32_t shard);
// The same path relative to the dataset directory.
std::string BlockTablesRelPath(uint32_t shard);
// Bytes between two chunks' tables in a block tables file: a full chunk's table.
inline uint64_t BlockTableStride(uint64_t chunk_bytes) { return ChunkBlockCount(chunk_bytes) * kBlockHashBytes; }
// Where chunk `chunk`'s table lies in its shard's block tables file (the last chunk's is shorter).
struct BlockTableSpan {
  uint64_t offset = 0, length = 0;
};
BlockTableSpan BlockTableAt(const v1::Manifest& m, uint32_t shard, uint64_t chunk);

// Parses and validates manifest bytes: format version, chunk size within bounds, one hash per
// chunk for each shard, sample counts adding up, relative shard paths without "..".
// `where` names the source (a path or "upstream X") in error messages. DataLoss on malformed
// bytes, InvalidArgument/FailedPrecondition on inconsistent content.
Result<v1::Manifest> ParseManifest(std::string_view bytes, const std::string& where);
Result<v1::SampleIndex> ParseSampleIndex(std::string_view bytes, const v1::Manifest& m,
                                         uint32_t shard, const std::string& where);

// Hex xxh3-128 of the manifest bytes.
std::string ManifestVersion(std::string_view manifest_bytes);

uint64_t ChunkCount(const v1::Manifest& m, uint32_t shard);
// Length of chunk `chunk` of `shard`: chunk_bytes except for a shard's last chunk.
// REQUIRES: chunk < ChunkCount(m, shard).
uint64_t ChunkLength(const v1::Manifest& m, uint32_t shard, uint64_t chunk);
Hash128 ChunkHash(const v1::Manifest& m, uint32_t shard, uint64_t chunk);

// A manifest with its exact bytes and version, as every tier passes it around.
struct Dataset {
  std::string name;  // the name it is served under (dataset_name.h); manifest.name() may differ
  std::string version;
  std::string manifest_bytes;
  v1::Manifest manifest;
};
using DatasetPtr = std::shared_ptr<const Dataset>;

// Builds a Dataset from manifest bytes (ParseManifest + version) named `served_name`, or the
// manifest's own name when that is empty (a directory loaded outside any upstream root).
Result<DatasetPtr> MakeDataset(std::string manifest_bytes, const std::string& where,
                               std::string served_name = {});

// Reads <dir>/.shardcache/manifest.pb and checks that every shard file exists with the size the
// manifest records (FailedPrecondition naming the file otherwise).
Result<DatasetPtr> LoadDatasetDir(const std::string& dataset_dir);
// Reads and validates a shard's sample index, checking its hash against the manifest.
Result<v1::SampleIndex> LoadSampleIndex(const std::string& dataset_dir, const v1::Manifest& m,
                                        uint32_t shard);

}  // namespace shardcache::dataset
