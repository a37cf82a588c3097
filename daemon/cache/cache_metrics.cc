#include "daemon/cache/cache_metrics.h"

namespace shardcache::cache {

const CacheMetrics& CacheMetrics::Get() {
  static const CacheMetrics m = [] {
    auto& r = metrics::Registry::Global();
    const char* served = "Chunk bytes served by the cache, by the tier they came from";
    CacheMetrics c{};
    c.bytes_dram = r.GetCounter("shardcache_cache_served_bytes_total", served, {{"tier", "dram"}});
    c.bytes_nvme = r.GetCounter("shardcache_cache_served_bytes_total", served, {{"tier", "nvme"}});
    c.bytes_upstream = r.GetCounter("shardcache_cache_served_bytes_total", served, {{"tier", "upstream"}});
    const char* hits = "Chunk reads answered by a cache tier";
    c.hits_dram = r.GetCounter("shardcache_cache_hits_total", hits, {{"tier", "dram"}});
    c.hits_nvme = r.GetCounter("shardcache_cache_hits_total", hits, {{"tier", "nvme"}});
    c.misses = r.GetCounter("shardcache_cache_misses_total", "Chunk reads no cache tier could answer");
    c.upstream_fetches = r.GetCounter("shardcache_cache_upstream_fetched_chunks_total",
                                      "Chunks fetched from upstream (one per single-flight leader)");
    c.evicted_segments = r.GetCounter("shardcache_cache_evicted_segments_total", "NVMe segments evicted");
    c.evicted_bytes = r.GetCounter("shardcache_cache_evicted_bytes_total", "Allocated bytes of evicted NVMe segments");
    c.checksum_failures = r.GetCounter("shardcache_cache_checksum_failures_total",
                                       "NVMe reads whose bytes did not match the manifest hash (dropped, refetched)");
    c.enospc_passthrough = r.GetCounter("shardcache_cache_enospc_passthrough_total",
                                        "Chunks served without storing because the cache disk was full");
    c.admission_declined = r.GetCounter("shardcache_cache_admission_declined_total",
                                        "Chunks the eviction policy declined to store (static full, clairvoyant bypass)");
    c.written_bytes = r.GetCounter("shardcache_cache_written_bytes_total", "Bytes written to NVMe segments");
    const char* unstored = "Verified chunks served but not stored on NVMe, by reason";
    c.unstored_larger_than_segment =
        r.GetCounter("shardcache_cache_unstored_chunks_total", unstored, {{"reason", "larger_than_segment"}});
    c.unstored_disk_failing =
        r.GetCounter("shardcache_cache_unstored_chunks_total", unstored, {{"reason", "disk_failing"}});
    c.nvme_errors = r.GetCounter("shardcache_cache_nvme_errors_total",
                                 "I/O errors of the NVMe tier (reads, writes, syncs, allocations, index commits)");
    c.nvme_healthy = r.GetGauge("shardcache_cache_nvme_healthy",
                                "0 while the NVMe tier's disk is failing (gone, I/O errors, full), else 1");
    c.nvme_healthy->Set(1);
    c.nvme_used_bytes = r.GetGauge("shardcache_cache_nvme_used_bytes", "Allocated bytes of the NVMe tier (segments + index)");
    c.nvme_budget_bytes = r.GetGauge("shardcache_cache_nvme_budget_bytes",
                                   "NVMe budget in effect: cache.size, or what the file system holds above min_free");
    c.index_memory_bytes = r.GetGauge("shardcache_cache_index_memory_bytes",
                                      "Memory the NVMe tier's RocksDB index holds (memtables, block cache, table readers)");
    c.dram_used_bytes = r.GetGauge("shardcache_cache_dram_used_bytes", "Chunk bytes held by the DRAM tier");
    c.dram_budget_bytes = r.GetGauge("shardcache_cache_dram_budget_bytes", "cache.memory_size");
    c.nvme_read_seconds = r.GetHistogram("shardcache_cache_nvme_read_seconds",
                                         "Latency of one io_uring read batch of the NVMe tier",
                                         metrics::LatencyBuckets());
    return c;
  }();
  return m;
}

}  // namespace shardcache::cache
