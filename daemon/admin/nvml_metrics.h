// NvmlMetrics: GPU utilization and memory of every GPU on the node, read through NVML, which is
// loaded at run time with dlopen("libnvidia-ml.so.1") so that the daemon neither links against
// nor requires the NVIDIA driver. Where the library is absent (CPU-only node, container without
// the driver mounted) the GPU metrics are simply not exported, with one info log line.
//
// Exported per GPU (labels gpu="<index>", name="<model>"):
//   shardcache_gpu_utilization_ratio        0..1, fraction of the last sample period a kernel ran
//   shardcache_gpu_memory_utilization_ratio 0..1, fraction of time device memory was read/written
//   shardcache_gpu_memory_used_bytes, shardcache_gpu_memory_total_bytes
//
// Thread safety: Update() is serialized by an internal mutex; call it from any thread.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "common/metrics.h"
#include "common/mutex.h"

namespace shardcache::admin {

class NvmlMetrics {
 public:
  // Tries to load and initialize NVML; never fails (see available()).
  explicit NvmlMetrics(metrics::Registry& registry = metrics::Registry::Global(),
                       const std::string& library = "libnvidia-ml.so.1");
  ~NvmlMetrics();
  NvmlMetrics(const NvmlMetrics&) = delete;
  NvmlMetrics& operator=(const NvmlMetrics&) = delete;

  bool available() const { return api_ != nullptr; }
  size_t gpu_count() const { return gpus_.size(); }
  // Samples every GPU and sets the gauges; a GPU whose query fails keeps its last values.
  void Update();

 private:
  struct Api;
  struct Gpu {
    void* handle;
    metrics::Gauge* utilization;
    metrics::Gauge* memory_utilization;
    metrics::Gauge* memory_used;
    metrics::Gauge* memory_total;
  };
  std::unique_ptr<Api> api_;
  std::vector<Gpu> gpus_;
  Mutex mu_;
};

}  // namespace shardcache::admin
