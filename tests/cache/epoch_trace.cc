#include "tests/cache/epoch_trace.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <numeric>
#include <random>

#include "daemon/cache/cached_source.h"

namespace shardcache::testing {

uint64_t EpochTraceResult::UpstreamBytes() const {
  return std::accumulate(upstream_bytes_per_epoch.begin(), upstream_bytes_per_epoch.end(), uint64_t{0});
}

std::vector<cache::ChunkRef> GlobalShuffleTrace(const dataset::Dataset& d, uint32_t epochs, uint64_t seed) {
  std::vector<cache::ChunkRef> all;
  for (uint32_t s = 0; s < static_cast<uint32_t>(d.manifest.shards_size()); ++s) {
    for (uint64_t c = 0; c < dataset::ChunkCount(d.manifest, s); ++c) all.push_back({s, c});
  }
  std::vector<cache::ChunkRef> trace;
  trace.reserve(all.size() * epochs);
  for (uint32_t e = 0; e < epochs; ++e) {
    std::mt19937_64 rng(seed * 1000003 + e);
    std::shuffle(all.begin(), all.end(), rng);
    trace.insert(trace.end(), all.begin(), all.end());
  }
  return trace;
}

Result<EpochTraceResult> RunEpochTrace(const EpochTraceOptions& o) {
  auto ds = MakeSyntheticDataset(o.dataset);
  // A short write queue: chunks waiting for the writer are served from memory, and a long
  // queue would act as an unbudgeted extra tier and blur the policies' hit ratios.
  cache::CacheOptions copts = o.cache;
  copts.write_queue_bytes = 2 * o.dataset.chunk_bytes;
  auto up = std::make_unique<FakeUpstream>();
  up->AddDataset(o.dataset, ds);
  FakeUpstream* upstream = up.get();
  SC_ASSIGN_OR_RETURN(auto cache, cache::CachedSource::Open(copts, std::move(up)));
  const auto trace = GlobalShuffleTrace(*ds, o.epochs, o.shuffle_seed);
  if (o.cache.eviction == cache::EvictionPolicyKind::kClairvoyant) {
    cache->SetFutureAccessOrder(ds->version, 0, trace);
  }
  EpochTraceResult r;
  const size_t per_epoch = trace.size() / o.epochs;
  const auto t0 = std::chrono::steady_clock::now();
  for (uint32_t e = 0; e < o.epochs; ++e) {
    const uint64_t chunks0 = upstream->chunks_sent.load();
    const uint64_t bytes0 = upstream->bytes_sent.load();
    for (size_t i = e * per_epoch; i < (e + 1) * per_epoch; ++i) {
      auto c = cache->ReadChunk(ds, trace[i].shard, trace[i].chunk, ReadOptions());
      if (!c.ok() || (*c)->hash != dataset::ChunkHash(ds->manifest, trace[i].shard, trace[i].chunk)) ++r.errors;
    }
    const uint64_t fetched = upstream->chunks_sent.load() - chunks0;
    r.reads_per_epoch.push_back(per_epoch);
    r.upstream_chunks_per_epoch.push_back(fetched);
    r.upstream_bytes_per_epoch.push_back(upstream->bytes_sent.load() - bytes0);
    if (e > 0) {
      r.reads_after_first += per_epoch;
      r.hits_after_first += per_epoch - std::min<uint64_t>(fetched, per_epoch);
    }
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  cache->Flush();
  r.cache_stats_json = cache->Stats().ToJson();
  return r;
}

}  // namespace shardcache::testing
