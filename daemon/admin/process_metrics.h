// ProcessMetrics: metrics describing the daemon process itself (resident memory, malloc heap in
// use and free, CPU time, uptime, open descriptors), refreshed from /proc each time /metrics is scraped. CPU time is a
// counter (shardcache_process_cpu_seconds_total, kept in clock ticks): it only grows, and
// rate() over it is the CPU share.
//
// Thread safety: Update() may be called from any thread; the metrics are atomics.
#pragma once

#include <chrono>

#include "common/metrics.h"

namespace shardcache::admin {

class ProcessMetrics {
 public:
  explicit ProcessMetrics(metrics::Registry& registry = metrics::Registry::Global());
  // Reads /proc/self and sets the gauges. Values that cannot be read keep their last value.
  void Update();

 private:
  const std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  metrics::Gauge* resident_bytes_;
  metrics::Gauge* virtual_bytes_;
  metrics::Counter* cpu_ticks_;
  metrics::Gauge* uptime_seconds_;
  metrics::Gauge* open_fds_;
  metrics::Gauge* threads_;
  metrics::Gauge* heap_in_use_bytes_;
  metrics::Gauge* heap_free_bytes_;
};

}  // namespace shardcache::admin
