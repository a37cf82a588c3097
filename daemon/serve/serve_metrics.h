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
// A delivery is counted once, in its (dataset, rank) series: the node's totals
// (shardcache_serve_{batches,bytes,stall_seconds}_total, `clients` in /status) are the sums of
// those series, rendered through a stats::Source (common/stats.h), not counted a second time.
//
// Thread safety: the pointed-to metrics are lock-free; ForLoader takes the registry's lock and
// a leaf lock over the pairs, which SumDelivered() and the totals' rendering take too.
#pragma once

#include <cstdint>
#include <string>

#include "common/metrics.h"

namespace shardcache::serve {

struct ServeMetrics {
  metrics::Counter* chunk_reads;         // chunks read to assemble batches
  metrics::Counter* warm_reads;          // chunks read ahead of demand
  metrics::Counter* refused_connections;
  metrics::Gauge* connections;
  metrics::Histogram* next_wait_seconds;
  metrics::Histogram* batch_assembly_seconds;

  // Registers every family of the service (the totals' source too) on first use.
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

// What every loader of the process was delivered: the sums of all (dataset, rank) series.
struct DeliveredTotals {
  uint64_t batches = 0;
  uint64_t bytes = 0;
  uint64_t stall_us = 0;  // time trainers waited in NextBatch
};
DeliveredTotals SumDelivered();

}  // namespace shardcache::serve
