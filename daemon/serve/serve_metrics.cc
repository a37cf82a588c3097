#include "daemon/serve/serve_metrics.h"

#include <map>
#include <set>
#include <utility>

#include "common/mutex.h"
#include "common/stats.h"

namespace shardcache::serve {

namespace {

constexpr stats::Family kBatches{"shardcache_serve_batches_total", "Batches delivered to trainers"};
constexpr stats::Family kBytes{"shardcache_serve_bytes_total",
                               "Sample bytes delivered to trainers through shared memory"};
constexpr stats::Family kStall{"shardcache_serve_stall_seconds_total",
                               "Time trainers waited in NextBatch for data, summed over loaders"};

// The (dataset, rank) pairs given series of their own, and every series made (".other" once).
struct LoaderPairs {
  Mutex mu;
  std::set<std::pair<std::string, uint32_t>> pairs GUARDED_BY(mu);
  std::map<metrics::Labels, LoaderSeries> series GUARDED_BY(mu);
};

LoaderPairs& Pairs() {
  static auto* p = new LoaderPairs();  // never destroyed: loaders may count until exit
  return *p;
}

// The node's totals, summed over the series at each render.
class TotalsSource final : public stats::Source {
 public:
  void VisitStats(const stats::Visitor& visit) const override {
    const DeliveredTotals t = SumDelivered();
    stats::Counter(visit, kBatches, t.batches);
    stats::Counter(visit, kBytes, t.bytes);
    stats::ScaledCounter(visit, kStall, t.stall_us, 1e-6);
  }
};

}  // namespace

const ServeMetrics& ServeMetrics::Get() {
  static const ServeMetrics m = [] {
    auto& r = metrics::Registry::Global();
    ServeMetrics s{};
    // Never destroyed, nor removed: loaders may count, and /metrics render, until exit. The
    // handle lives inside the object the registry points at, so leak checkers see it reachable.
    struct Totals {
      TotalsSource source;
      metrics::SourceHandle registration;
    };
    static Totals* totals = [&r] {
      auto* t = new Totals();
      t->registration = r.AddSource(&t->source);
      return t;
    }();
    (void)totals;
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
  LoaderPairs& p = Pairs();
  metrics::Labels labels = {{"dataset", dataset}, {"rank", std::to_string(rank)}};
  {
    MutexLock lock(&p.mu);
    if (p.pairs.count({dataset, rank}) == 0) {
      if (p.pairs.size() < kMaxLoaderSeries) p.pairs.emplace(dataset, rank);
      else labels = {{"dataset", ".other"}, {"rank", ".other"}};
    }
  }
  auto& r = metrics::Registry::Global();
  const LoaderSeries series{
      r.GetCounter("shardcache_loader_bytes_total", "Sample bytes delivered to the loaders of one dataset and rank",
                   labels),
      r.GetCounter("shardcache_loader_batches_total", "Batches delivered to the loaders of one dataset and rank",
                   labels),
      r.GetScaledCounter("shardcache_loader_stall_seconds_total",
                         "Time the trainers of one dataset and rank waited in NextBatch for data", 1e-6, labels),
      r.GetGauge("shardcache_loader_open", "Loaders of one dataset and rank open now", labels),
  };
  MutexLock lock(&p.mu);
  p.series.emplace(labels, series);  // the same pointers when the pair had series already
  return series;
}

DeliveredTotals SumDelivered() {
  LoaderPairs& p = Pairs();
  MutexLock lock(&p.mu);
  DeliveredTotals t;
  for (const auto& [labels, s] : p.series) {
    t.batches += s.batches->Value();
    t.bytes += s.bytes->Value();
    t.stall_us += s.stall_us->Value();
  }
  return t;
}

}  // namespace shardcache::serve
