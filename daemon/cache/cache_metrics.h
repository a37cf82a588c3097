// CacheMetrics: the cache tiers' Prometheus metrics in metrics::Registry::Global(), looked up
// once. All names start with shardcache_cache_. Process-wide: several CachedSource instances in
// one process (tests) add to the same series; per-instance figures come from Stats().
//
// Thread safety: the pointed-to metrics are lock-free; the struct is immutable.
#pragma once

#include "common/metrics.h"

namespace shardcache::cache {

struct CacheMetrics {
  metrics::Counter* bytes_dram;       // bytes served from the DRAM tier
  metrics::Counter* bytes_nvme;       // bytes served from the NVMe tier
  metrics::Counter* bytes_upstream;   // bytes served after an upstream fetch
  metrics::Counter* hits_dram;
  metrics::Counter* hits_nvme;
  metrics::Counter* misses;           // chunks not in any tier (fetched or joined a fetch)
  metrics::Counter* upstream_fetches; // chunks this cache fetched from upstream (flight leaders)
  metrics::Counter* evicted_segments;
  metrics::Counter* evicted_bytes;
  metrics::Counter* checksum_failures;
  metrics::Counter* enospc_passthrough;
  metrics::Counter* admission_declined;
  metrics::Counter* written_bytes;
  metrics::Counter* unstored_larger_than_segment;  // chunks whose extent exceeds a segment
  metrics::Counter* unstored_disk_failing;         // chunks not stored while the disk failed
  metrics::Counter* nvme_errors;                   // I/O errors of the NVMe tier
  metrics::Gauge* nvme_healthy;                    // 1 unless the NVMe tier's disk is failing
  metrics::Gauge* nvme_used_bytes;    // allocated segment bytes + index bytes
  metrics::Gauge* index_memory_bytes;
  metrics::Gauge* nvme_budget_bytes;
  metrics::Gauge* dram_used_bytes;
  metrics::Gauge* dram_budget_bytes;
  metrics::Histogram* nvme_read_seconds;  // one io_uring batch, submission to last completion

  static const CacheMetrics& Get();
};

}  // namespace shardcache::cache
