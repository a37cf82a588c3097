#include "daemon/admin/nvml_metrics.h"

#include <catch2/catch.hpp>

namespace shardcache::admin {
namespace {

TEST_CASE("without libnvidia-ml the GPU metrics are simply absent", "[deploy][nvml]") {
  metrics::Registry registry;
  NvmlMetrics nvml(registry, "libnvidia-ml-does-not-exist.so.1");
  CHECK_FALSE(nvml.available());
  nvml.Update();  // harmless
  CHECK(registry.RenderPrometheus().find("shardcache_gpu") == std::string::npos);
}

TEST_CASE("with an NVML library the GPU utilization and memory of every GPU are exported", "[deploy][nvml]") {
  metrics::Registry registry;
  NvmlMetrics nvml(registry, SC_FAKE_NVML_PATH);
  REQUIRE(nvml.available());
  CHECK(nvml.gpu_count() == 2);
  const std::string text = registry.RenderPrometheus();
  INFO(text);
  CHECK(text.find("# TYPE shardcache_gpu_utilization_ratio gauge") != std::string::npos);
  CHECK(registry.ValueOf("shardcache_gpu_utilization_ratio", {{"gpu", "1"}, {"name", "Fake GPU"}}) ==
        Approx(0.42));
  CHECK(registry.ValueOf("shardcache_gpu_memory_used_bytes", {{"gpu", "0"}, {"name", "Fake GPU"}}) ==
        double(3ull << 30));
  CHECK(registry.ValueOf("shardcache_gpu_memory_total_bytes", {{"gpu", "0"}, {"name", "Fake GPU"}}) ==
        double(80ull << 30));
}

}  // namespace
}  // namespace shardcache::admin
