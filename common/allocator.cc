#include "common/allocator.h"

#include <cstddef>

// jemalloc's control interface, present only where the program links jemalloc (weak: null
// otherwise, so one build of this file serves both).
extern "C" int mallctl(const char* name, void* oldp, size_t* oldlenp, void* newp, size_t newlen)
    __attribute__((weak));

namespace shardcache {
namespace {

bool UsingJemalloc() { return mallctl != nullptr; }

// MALLCTL_ARENAS_ALL in jemalloc.h: "arena.<i>.purge" with this index purges every arena.
constexpr unsigned kAllArenas = 4096;

uint64_t JemallocStat(const char* name) {
  size_t value = 0;
  size_t len = sizeof(value);
  return mallctl(name, &value, &len, nullptr, 0) == 0 ? value : 0;
}

}  // namespace

std::string AllocatorName() {
  if (!UsingJemalloc()) return "libc malloc";
  const char* version = nullptr;
  size_t len = sizeof(version);
  if (mallctl("version", &version, &len, nullptr, 0) != 0 || version == nullptr) return "jemalloc";
  return std::string("jemalloc ") + version;
}

HeapStats ReadHeapStats() {
  HeapStats s;
  if (!UsingJemalloc()) return s;
  // The statistics are a snapshot taken when the epoch advances.
  uint64_t epoch = 1;
  size_t len = sizeof(epoch);
  mallctl("epoch", &epoch, &len, &epoch, len);
  s.in_use_bytes = JemallocStat("stats.allocated");
  const uint64_t resident = JemallocStat("stats.resident");
  s.free_bytes = resident > s.in_use_bytes ? resident - s.in_use_bytes : 0;
  return s;
}

void ReturnFreeHeapToKernel() {
  if (!UsingJemalloc()) return;
  const std::string purge = "arena." + std::to_string(kAllArenas) + ".purge";
  mallctl(purge.c_str(), nullptr, nullptr, nullptr, 0);
}

}  // namespace shardcache
