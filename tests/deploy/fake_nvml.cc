// A stand-in for libnvidia-ml.so.1 with the few NVML entry points NvmlMetrics uses: two GPUs
// with fixed utilization and memory figures. Exercises the dlopen/dlsym path and the gauges
// on machines without an NVIDIA driver. Not NVIDIA code; declarations follow nvml.h.
#include <cstring>

extern "C" {
int nvmlInit_v2() { return 0; }
int nvmlShutdown() { return 0; }
int nvmlDeviceGetCount_v2(unsigned int* n) { *n = 2; return 0; }
int nvmlDeviceGetHandleByIndex_v2(unsigned int i, void** h) {
  static int devices[2];
  if (i >= 2) return 2;  // NVML_ERROR_INVALID_ARGUMENT
  *h = &devices[i];
  return 0;
}
int nvmlDeviceGetName(void*, char* name, unsigned int len) {
  std::strncpy(name, "Fake GPU", len);
  return 0;
}
struct Utilization { unsigned int gpu, memory; };
int nvmlDeviceGetUtilizationRates(void*, Utilization* u) { u->gpu = 42; u->memory = 7; return 0; }
struct Memory { unsigned long long total, free, used; };
int nvmlDeviceGetMemoryInfo(void*, Memory* m) {
  m->total = 80ull << 30;
  m->used = 3ull << 30;
  m->free = m->total - m->used;
  return 0;
}
const char* nvmlErrorString(int) { return "fake error"; }
}
