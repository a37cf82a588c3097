#include "daemon/serve/serve_metrics.h"

#include <set>
#include <utility>

#include "common/mutex.h"

namespace shardcache::serve {

const ServeMetrics& ServeMetrics::Get() {
  static const ServeMetrics m = [] {
    auto& r = metrics::Registry::Global();
    ServeMetrics s{};
    s.batches = r.GetCounter("shardcache_serve_batches_total", "Batches delivered to trainers");
    s.bytes = r.GetCounter("shardcache_serve_bytes_total",
                           "Sample bytes delivered to trainers through shared memory");
    s.stall_us = r.GetScaledCounter("shardcache_serve_stall_seconds_total",
                                    "Time trainers waited in NextBatch for data, summed over loaders", 1e-6);
    s.chunk_reads = r.GetCounter("shardcache_serve_chunk_reads_total",
                                 "Chunks read by the local service to assemble batches");
    s.warm_reads = r.GetCounter("shardcache_serve_warm_reads_total", "Chunks read ahead of demand by the prefetcher");
    s.refused_connections = r.GetCounter(
        "shardcache_serve_refused_connections_total",
        "Local connections refused (peer credentials not allowed, or too many connections)");
    s.connections = r.GetGauge("shardcache_serve_connections", "Trainer connections to the local service");
    s.next_wait_seconds = r.GetHistogram("shardcache_serve_next_wait_seconds",
                                         "Time NextBatch waited for its batch's data", metrics::LatencyBuckets());
    s.batch_assembly_seconds = r.GetHistogram(
        "shardcache_serve_batch_assembly_seconds",
        "Time to assemble one batch into its shared-memory slot (chunk reads + copies)", metrics::LatencyBuckets());
    return s;
  }();
  return m;
}

LoaderSeries ForLoader(const std::string& dataset, uint32_t rank) {
  static Mutex mu;
  static std::set<std::pair<std::string, uint32_t>> pairs GUARDED_BY(mu);
  metrics::Labels labels = {{"dataset", dataset}, {"rank", std::to_string(rank)}};
  {
    MutexLock lock(&mu);
    if (pairs.count({dataset, rank}) == 0) {
      if (pairs.size() < kMaxLoaderSeries) pairs.emplace(dataset, rank);
      else labels = {{"dataset", ".other"}, {"rank", ".other"}};
    }
  }
  auto& r = metrics::Registry::Global();
  return LoaderSeries{
      r.GetCounter("shardcache_loader_bytes_total", "Sample bytes delivered to the loaders of one dataset and rank",
                   labels),
      r.GetCounter("shardcache_loader_batches_total", "Batches delivered to the loaders of one dataset and rank",
                   labels),
      r.GetScaledCounter("shardcache_loader_stall_seconds_total",
                         "Time the trainers of one dataset and rank waited in NextBatch for data", 1e-6, labels),
      r.GetGauge("shardcache_loader_open", "Loaders of one dataset and rank open now", labels),
  };
}

}  // namespace shardcache::serve
