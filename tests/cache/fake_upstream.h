// Test double for the cache tests and cache benchmarks: synthetic datasets whose bytes are a
// pure function of (seed, shard, chunk), and FakeUpstream, a ChunkSource serving them with
// fault injection — counting fetches per chunk, failing (Unavailable), stalling until the
// caller's deadline, delaying, and corrupting bytes (which a verifying tier must catch).
//
// Thread safety: FakeUpstream is safe for concurrent use; fault knobs are atomics.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "daemon/source/chunk_source.h"

namespace shardcache::testing {

struct SyntheticDatasetOptions {
  std::string name = "synthetic";
  uint32_t shards = 2;
  uint64_t shard_bytes = 8ull << 20;   // multiple of record_bytes
  uint64_t chunk_bytes = 1ull << 20;
  uint64_t record_bytes = 4096;
  uint64_t seed = 1;
};

// Fills `out` with the deterministic bytes of one chunk.
void FillSyntheticChunk(uint64_t seed, uint32_t shard, uint64_t chunk, uint8_t* out, size_t length);
// A records-format dataset with correct per-chunk hashes; aborts the test process on failure.
DatasetPtr MakeSyntheticDataset(const SyntheticDatasetOptions& options);
// Verified chunk bytes of (dataset, shard, chunk) as FakeUpstream would send them.
ChunkPtr MakeSyntheticChunk(const SyntheticDatasetOptions& options, const DatasetPtr& dataset,
                            uint32_t shard, uint64_t chunk);

class FakeUpstream final : public ChunkSource {
 public:
  void AddDataset(const SyntheticDatasetOptions& options, DatasetPtr dataset);

  Result<std::vector<v1::DatasetSummary>> ListDatasets() override;
  Result<DatasetPtr> OpenDataset(const std::string& name) override;
  Result<std::string> GetSampleIndex(const DatasetPtr& dataset, uint32_t shard) override;
  Status ReadChunks(const DatasetPtr& dataset, uint32_t shard, uint64_t first, uint64_t count,
                    const ReadOptions& options, const ChunkSink& sink) override;

  // Fault knobs.
  std::atomic<bool> fail{false};          // every call: Unavailable
  std::atomic<bool> stall{false};         // ReadChunks blocks until the caller's deadline
  std::atomic<uint32_t> delay_ms{0};      // before each ReadChunks call
  std::atomic<uint32_t> corrupt_next{0};  // flip a byte in the next N chunks sent

  // Counters.
  std::atomic<uint64_t> calls{0};
  std::atomic<uint64_t> chunks_sent{0};
  std::atomic<uint64_t> bytes_sent{0};
  uint64_t FetchCount(uint32_t shard, uint64_t chunk) const;

 private:
  struct Entry {
    SyntheticDatasetOptions options;
    DatasetPtr dataset;
  };
  mutable std::mutex mu_;
  std::map<std::string, Entry> datasets_;                       // by name
  std::map<std::pair<uint32_t, uint64_t>, uint64_t> fetches_;   // GUARDED_BY(mu_)
};

}  // namespace shardcache::testing
