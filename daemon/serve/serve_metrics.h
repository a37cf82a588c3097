// ServeMetrics: the local service's Prometheus metrics in metrics::Registry::Global(), looked
// up once, so that every family exists (at zero) from the moment the service is built rather
// than from its first event. All names start with shardcache_serve_ or shardcache_loader_.
//
// Per-loader figures are kept per (dataset, rank), not per loader: a loader id grows with every
// open (each epoch, each DataLoader worker), so a label on it would grow without bound, while
// a node sees few datasets and the few ranks its GPUs run. A (dataset, rank) series lives as
// long as the daemon (its counters stay monotonic across the loaders that come and go), and at
// most kMaxLoaderSeries of them are made; loaders of further pairs are counted under
// dataset=".other", rank=".other" (no dataset name starts with '.').
//
// Thread safety: the pointed-to metrics are lock-free; ForLoader takes the registry's lock.
#pragma once

#include <cstdint>
#include <string>

#include "common/metrics.h"

namespace shardcache::serve {

struct ServeMetrics {
  metrics::Counter* batches;             // batches delivered to trainers
  metrics::Counter* bytes;               // sample bytes delivered
  metrics::Counter* stall_us;            // time trainers waited in NextBatch (exposed in seconds)
  metrics::Counter* chunk_reads;         // chunks read to assemble batches
  metrics::Counter* warm_reads;          // chunks read ahead of demand
  metrics::Counter* refused_connections;
  metrics::Gauge* connections;
  metrics::Histogram* next_wait_seconds;
  metrics::Histogram* batch_assembly_seconds;

  static const ServeMetrics& Get();
};

// The series of one (dataset, rank) pair.
struct LoaderSeries {
  metrics::Counter* bytes;
  metrics::Counter* batches;
  metrics::Counter* stall_us;  // exposed in seconds
  metrics::Gauge* open;        // loaders of this pair open now
};

// Most (dataset, rank) pairs with series of their own.
constexpr size_t kMaxLoaderSeries = 256;

// The series for a loader of `dataset` at `rank` (see the cap above).
LoaderSeries ForLoader(const std::string& dataset, uint32_t rank);

}  // namespace shardcache::serve
