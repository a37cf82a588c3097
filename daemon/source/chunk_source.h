// ChunkSource: the one interface every tier of the fetch path implements.
//
//   FileSource (upstream = file://)   — reads a dataset directory; the origin role.
//   GrpcSource (upstream = grpc://)   — fetches from another shardcached over the network.
//   CachedSource (cache tiers)        — DRAM + NVMe in front of another ChunkSource.
//
// The Origin gRPC service serves any ChunkSource, and the local (trainer) service reads from
// one, so a node daemon, a city-local middle tier and the origin are the same program with a
// different upstream. Every chunk a ChunkSource hands out has been verified against its
// manifest hash *by that source* (end-to-end: a tier never trusts what it received).
//
// Thread safety: implementations are safe for concurrent use from any thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/fs.h"
#include "common/hash.h"
#include "common/status.h"
#include "dataset/manifest.h"
#include "shardcache/origin.pb.h"

namespace shardcache {

using dataset::DatasetPtr;

// Verified bytes of one chunk. Immutable once published; shared by every reader.
struct Chunk {
  AlignedBuffer bytes;   // bytes.size() == chunk length
  Hash128 hash;
};
using ChunkPtr = std::shared_ptr<const Chunk>;

enum class FetchPriority { kDemand = 0, kPrefetch = 1 };

struct ReadOptions {
  // Absolute deadline for the whole call. Default: 60 s from construction.
  std::chrono::steady_clock::time_point deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(60);
  FetchPriority priority = FetchPriority::kDemand;
};

// Receives chunks in order. Returning a non-OK status stops the read with that status.
using ChunkSink = std::function<Status(uint64_t chunk_index, const ChunkPtr& chunk)>;

class ChunkSource {
 public:
  virtual ~ChunkSource() = default;

  virtual Result<std::vector<v1::DatasetSummary>> ListDatasets() = 0;

  // The current manifest of dataset `name`. NotFound for unknown names, InvalidArgument for
  // names that are not plain dataset names (no '/', "..", leading '.').
  virtual Result<DatasetPtr> OpenDataset(const std::string& name) = 0;

  // Serialized SampleIndex of one shard (validated against the manifest).
  virtual Result<std::string> GetSampleIndex(const DatasetPtr& dataset, uint32_t shard) = 0;

  // Delivers chunks [first, first + count) of `shard` to `sink` in order, each verified.
  // InvalidArgument when the range lies outside the shard; Unavailable / DeadlineExceeded when
  // the data cannot be had in time; DataLoss when it keeps failing verification.
  virtual Status ReadChunks(const DatasetPtr& dataset, uint32_t shard, uint64_t first,
                            uint64_t count, const ReadOptions& options, const ChunkSink& sink) = 0;

  // Convenience: one chunk.
  Result<ChunkPtr> ReadChunk(const DatasetPtr& dataset, uint32_t shard, uint64_t chunk,
                             const ReadOptions& options);
};

// Checks that [first, first+count) lies inside `shard` of `dataset`; InvalidArgument naming
// the range otherwise. Shared by every implementation.
Status CheckChunkRange(const DatasetPtr& dataset, uint32_t shard, uint64_t first, uint64_t count);

// Rejects dataset names that could leave a root directory: empty, '/', "..", leading '.',
// NUL, longer than 255 bytes.
Status CheckDatasetName(const std::string& name);

// Summary line of a dataset for ListDatasets.
v1::DatasetSummary SummarizeDataset(const dataset::Dataset& d);

}  // namespace shardcache
