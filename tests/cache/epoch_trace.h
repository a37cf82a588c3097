// Epoch traces for eviction-policy tests and the `epochs` benchmark: a dataset read for several
// epochs, each epoch a fresh global shuffle (a permutation of all chunks), through a real
// CachedSource over a FakeUpstream. The clairvoyant policy is told the whole trace up front
// (as the epoch planner would); reads advance its clock.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "daemon/cache/cache_options.h"
#include "daemon/cache/access_plan.h"
#include "tests/cache/fake_upstream.h"

namespace shardcache::testing {

struct EpochTraceOptions {
  SyntheticDatasetOptions dataset;
  cache::CacheOptions cache;        // dir, size, segment size, eviction set by the caller
  uint32_t epochs = 3;
  uint64_t shuffle_seed = 17;
};

struct EpochTraceResult {
  std::vector<uint64_t> reads_per_epoch;
  std::vector<uint64_t> upstream_chunks_per_epoch;
  std::vector<uint64_t> upstream_bytes_per_epoch;
  uint64_t hits_after_first = 0;     // reads in epochs 2.. that upstream did not serve
  uint64_t reads_after_first = 0;
  double HitRatioAfterFirst() const {
    return reads_after_first ? static_cast<double>(hits_after_first) / reads_after_first : 0;
  }
  uint64_t UpstreamBytes() const;
  uint64_t errors = 0;               // failed reads or wrong bytes
  double seconds = 0;
  std::string cache_stats_json;      // CacheStats at the end
};

// The chunk order of `epochs` global-shuffle epochs over every chunk of `dataset`.
std::vector<cache::ChunkRef> GlobalShuffleTrace(const dataset::Dataset& dataset, uint32_t epochs, uint64_t seed);

// Runs the trace; fails (Status) only when the cache cannot be opened.
Result<EpochTraceResult> RunEpochTrace(const EpochTraceOptions& options);

}  // namespace shardcache::testing
