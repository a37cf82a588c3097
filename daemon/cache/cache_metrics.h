// CacheMetrics: the cache tiers' Prometheus families. All names start with shardcache_cache_.
//
// Figures the tiers keep per instance (their Stats()) are theirs alone: CachedSource and
// NvmeStore are stats::Sources (common/stats.h) reporting them under the Family constants
// below, and the Registry sums the live instances (several in one process, in tests) into
// one series. What no instance keeps (NVMe errors, unstored chunks, disk health, read latency)
// is a Registry metric the struct below points to. Get() registers every family once, so all
// exist (at zero) from the first cache on.
//
// Thread safety: the pointed-to metrics are lock-free; the struct is immutable.
#pragma once

#include "common/metrics.h"
#include "common/stats.h"

namespace shardcache::cache {

using stats::Family;

// Reported by CachedSource::VisitStats.
inline constexpr Family kServedBytes{"shardcache_cache_served_bytes_total",
                                     "Chunk bytes served by the cache, by the tier they came from"};
inline constexpr Family kHits{"shardcache_cache_hits_total", "Chunk reads answered by a cache tier"};
inline constexpr Family kMisses{"shardcache_cache_misses_total", "Chunk reads no cache tier could answer"};
inline constexpr Family kUpstreamFetches{"shardcache_cache_upstream_fetched_chunks_total",
                                         "Chunks fetched from upstream (one per single-flight leader)"};
inline constexpr Family kRunsKept{"shardcache_cache_runs_kept_total",
                                  "Sample byte ranges kept by the tiers without their whole chunk (chunk_run.h)"};
inline constexpr Family kRunHits{"shardcache_cache_run_hits_total",
                                 "Pieces answered by a kept run instead of a whole chunk"};
inline constexpr Family kDramUsed{"shardcache_cache_dram_used_bytes", "Chunk bytes held by the DRAM tier"};
inline constexpr Family kDramBudget{"shardcache_cache_dram_budget_bytes", "cache.memory_size"};
// Reported by NvmeStore::VisitStats.
inline constexpr Family kEvictedSegments{"shardcache_cache_evicted_segments_total", "NVMe segments evicted"};
inline constexpr Family kEvictedBytes{"shardcache_cache_evicted_bytes_total",
                                      "Allocated bytes of evicted NVMe segments"};
inline constexpr Family kChecksumFailures{
    "shardcache_cache_checksum_failures_total",
    "NVMe reads whose bytes did not match the manifest hash (dropped, refetched)"};
inline constexpr Family kEnospcPassthrough{"shardcache_cache_enospc_passthrough_total",
                                           "Chunks served without storing because the cache disk was full"};
inline constexpr Family kAdmissionDeclined{
    "shardcache_cache_admission_declined_total",
    "Chunks the eviction policy declined to store (static full, clairvoyant bypass)"};
inline constexpr Family kWrittenBytes{"shardcache_cache_written_bytes_total", "Bytes written to NVMe segments"};
inline constexpr Family kNvmeUsed{"shardcache_cache_nvme_used_bytes",
                                  "Allocated bytes of the NVMe tier (segments + index)"};
inline constexpr Family kNvmeBudget{
    "shardcache_cache_nvme_budget_bytes",
    "NVMe budget in effect: cache.size, or what the file system holds above min_free"};
inline constexpr Family kIndexMemory{
    "shardcache_cache_index_memory_bytes",
    "Memory the NVMe tier's RocksDB index holds (memtables, block cache, table readers)"};

struct CacheMetrics {
  metrics::Counter* unstored_larger_than_segment;  // chunks whose extent exceeds a segment
  metrics::Counter* unstored_disk_failing;         // chunks not stored while the disk failed
  metrics::Counter* nvme_errors;                   // I/O errors of the NVMe tier
  metrics::Gauge* nvme_healthy;                    // 1 unless the NVMe tier's disk is failing
  metrics::Histogram* nvme_read_seconds;  // one io_uring batch, submission to last completion

  // Registers every family of the cache (the sources' ones too) on first use.
  static const CacheMetrics& Get();
};

}  // namespace shardcache::cache
