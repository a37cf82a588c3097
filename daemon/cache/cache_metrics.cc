#include "daemon/cache/cache_metrics.h"

namespace shardcache::cache {

const CacheMetrics& CacheMetrics::Get() {
  static const CacheMetrics m = [] {
    auto& r = metrics::Registry::Global();
    CacheMetrics c{};
    // The sources' families, at zero until a CachedSource / NvmeStore adds its figures.
    for (const char* tier : {"dram", "nvme", "upstream"}) {
      r.GetCounter(kServedBytes.name, kServedBytes.help, {{"tier", tier}});
    }
    for (const char* tier : {"dram", "nvme"}) r.GetCounter(kHits.name, kHits.help, {{"tier", tier}});
    for (const Family& f : {kMisses, kUpstreamFetches, kEvictedSegments, kEvictedBytes, kChecksumFailures,
                            kEnospcPassthrough, kAdmissionDeclined, kWrittenBytes}) {
      r.GetCounter(f.name, f.help);
    }
    for (const Family& f : {kDramUsed, kDramBudget, kNvmeUsed, kNvmeBudget, kIndexMemory}) r.GetGauge(f.name, f.help);
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
    c.nvme_read_seconds = r.GetHistogram("shardcache_cache_nvme_read_seconds",
                                         "Latency of one io_uring read batch of the NVMe tier",
                                         metrics::LatencyBuckets());
    return c;
  }();
  return m;
}

}  // namespace shardcache::cache
