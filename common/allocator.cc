#include "common/allocator.h"

#include <cstddef>

// jemalloc's control interface, present only where the program links jemalloc (weak: null
// otherwise, so one build of this file serves both).
extern "C" int mallctl(const char* name, void* oldp, size_t* oldlenp, void* newp, size_t newlen)
    __attribute__((weak));

// jemalloc's options, read by it at start.
//   * narenas: jemalloc's default is 4 per core, so on a GPU node with 100+ cores each of the
//     daemon's ~300 threads could hold an arena of its own, each keeping its freed pages resident
//     until they decay. 8 is what a 2-core VM gets by default, where every figure in allocator.h
//     was measured; the data path allocates some 10^4 buffers a second, far below what 8 arena
//     locks serve. Not measured on a many-core node.
//   * tcache off: a thread's cache is made at its first allocation, and many of the daemon's
//     threads make their first on a cold epoch's first batch. Measured at 10 ms / 1000 Mbit /
//     64 KiB, alternating, 4 runs each: first batch 32-37 ms without the caches, 36-55 ms with
//     them (glibc: 31-41); node CPU over a cold tokens epoch 5.3-6.5 s against 5.7-7.1 s, hit
//     epoch 0.25 s/GiB both, goodput the same.
extern "C" {
const char* malloc_conf = "narenas:8,tcache:false";
}

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
  unsigned arenas = 0;
  len = sizeof(arenas);
  mallctl("opt.narenas", &arenas, &len, nullptr, 0);
  return std::string("jemalloc ") + version + ", " + std::to_string(arenas) + " arenas";
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
