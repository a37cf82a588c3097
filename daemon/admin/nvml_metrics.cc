#include "daemon/admin/nvml_metrics.h"

#include <dlfcn.h>

#include <spdlog/spdlog.h>

namespace shardcache::admin {
namespace {

// The few NVML declarations used, as in nvml.h (stable C ABI since NVML v2 entry points).
using nvmlReturn_t = int;
using nvmlDevice_t = void*;
constexpr nvmlReturn_t kNvmlSuccess = 0;
struct nvmlUtilization_t {
  unsigned int gpu;     // percent of time a kernel was executing
  unsigned int memory;  // percent of time device memory was being read or written
};
struct nvmlMemory_t {
  unsigned long long total;
  unsigned long long free;
  unsigned long long used;
};

}  // namespace

struct NvmlMetrics::Api {
  void* lib = nullptr;
  nvmlReturn_t (*init)() = nullptr;
  nvmlReturn_t (*shutdown)() = nullptr;
  nvmlReturn_t (*count)(unsigned int*) = nullptr;
  nvmlReturn_t (*handle_by_index)(unsigned int, nvmlDevice_t*) = nullptr;
  nvmlReturn_t (*name)(nvmlDevice_t, char*, unsigned int) = nullptr;
  nvmlReturn_t (*utilization)(nvmlDevice_t, nvmlUtilization_t*) = nullptr;
  nvmlReturn_t (*memory)(nvmlDevice_t, nvmlMemory_t*) = nullptr;
  const char* (*error_string)(nvmlReturn_t) = nullptr;
  ~Api() {
    if (shutdown != nullptr) shutdown();
    if (lib != nullptr) dlclose(lib);
  }
};

NvmlMetrics::NvmlMetrics(metrics::Registry& registry, const std::string& library) {
  auto api = std::make_unique<Api>();
  api->lib = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (api->lib == nullptr) {
    spdlog::info("GPU metrics off: {} not loadable ({})", library, dlerror());
    return;
  }
  auto sym = [&](const char* name) { return dlsym(api->lib, name); };
  api->init = reinterpret_cast<decltype(api->init)>(sym("nvmlInit_v2"));
  api->count = reinterpret_cast<decltype(api->count)>(sym("nvmlDeviceGetCount_v2"));
  api->handle_by_index = reinterpret_cast<decltype(api->handle_by_index)>(sym("nvmlDeviceGetHandleByIndex_v2"));
  api->name = reinterpret_cast<decltype(api->name)>(sym("nvmlDeviceGetName"));
  api->utilization = reinterpret_cast<decltype(api->utilization)>(sym("nvmlDeviceGetUtilizationRates"));
  api->memory = reinterpret_cast<decltype(api->memory)>(sym("nvmlDeviceGetMemoryInfo"));
  api->error_string = reinterpret_cast<decltype(api->error_string)>(sym("nvmlErrorString"));
  auto shutdown = reinterpret_cast<decltype(api->shutdown)>(sym("nvmlShutdown"));
  if (!api->init || !api->count || !api->handle_by_index || !api->name || !api->utilization ||
      !api->memory || !shutdown) {
    spdlog::info("GPU metrics off: {} lacks the NVML v2 entry points", library);
    return;
  }
  if (nvmlReturn_t rc = api->init(); rc != kNvmlSuccess) {
    spdlog::info("GPU metrics off: nvmlInit failed ({})",
                 api->error_string ? api->error_string(rc) : std::to_string(rc));
    return;
  }
  api->shutdown = shutdown;  // only after a successful init
  unsigned int n = 0;
  if (api->count(&n) != kNvmlSuccess) n = 0;
  for (unsigned int i = 0; i < n; ++i) {
    nvmlDevice_t h = nullptr;
    if (api->handle_by_index(i, &h) != kNvmlSuccess) continue;
    char name[96] = "unknown";
    api->name(h, name, sizeof name);
    const metrics::Labels labels = {{"gpu", std::to_string(i)}, {"name", name}};
    gpus_.push_back(Gpu{
        h,
        registry.GetGauge("shardcache_gpu_utilization_ratio",
                          "Fraction of the last NVML sample period during which a kernel ran", labels),
        registry.GetGauge("shardcache_gpu_memory_utilization_ratio",
                          "Fraction of the last NVML sample period during which device memory was accessed",
                          labels),
        registry.GetGauge("shardcache_gpu_memory_used_bytes", "Device memory in use (all processes)", labels),
        registry.GetGauge("shardcache_gpu_memory_total_bytes", "Device memory installed", labels)});
  }
  spdlog::info("GPU metrics on: NVML reports {} GPU(s)", gpus_.size());
  api_ = std::move(api);
  Update();
}

NvmlMetrics::~NvmlMetrics() = default;

void NvmlMetrics::Update() {
  if (!api_) return;
  MutexLock lock(&mu_);
  for (auto& g : gpus_) {
    nvmlUtilization_t u{};
    if (api_->utilization(g.handle, &u) == kNvmlSuccess) {
      g.utilization->Set(u.gpu / 100.0);
      g.memory_utilization->Set(u.memory / 100.0);
    }
    nvmlMemory_t m{};
    if (api_->memory(g.handle, &m) == kNvmlSuccess) {
      g.memory_used->Set(static_cast<double>(m.used));
      g.memory_total->Set(static_cast<double>(m.total));
    }
  }
}

}  // namespace shardcache::admin
