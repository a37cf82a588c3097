#include <catch2/catch.hpp>

#include <cstring>
#include <memory>
#include <vector>

#include "common/allocator.h"

namespace shardcache {
namespace {

constexpr uint64_t kMiB = 1 << 20;

#ifdef SC_TEST_JEMALLOC
TEST_CASE("allocator: jemalloc serves the heap; its statistics follow allocations and a purge returns free memory") {
  REQUIRE(AllocatorName().rfind("jemalloc 5", 0) == 0);
  CHECK(AllocatorName().find(", 8 arenas") != std::string::npos);  // allocator.cc's malloc_conf was read
  ReturnFreeHeapToKernel();
  const HeapStats before = ReadHeapStats();
  std::vector<std::unique_ptr<char[]>> buffers;
  for (int i = 0; i < 16; ++i) {
    buffers.emplace_back(new char[4 * kMiB]);
    std::memset(buffers.back().get(), i, 4 * kMiB);  // resident, not only reserved
  }
  const HeapStats held = ReadHeapStats();
  CHECK(held.in_use_bytes >= before.in_use_bytes + 64 * kMiB);
  buffers.clear();
  const HeapStats freed = ReadHeapStats();
  CHECK(freed.in_use_bytes < held.in_use_bytes - 60 * kMiB);
  // Part of the freed pages stays resident for reuse until it decays (seconds) or is purged
  // (measured: 24 of the 64 MiB).
  CHECK(freed.free_bytes >= before.free_bytes + 8 * kMiB);
  ReturnFreeHeapToKernel();
  const HeapStats purged = ReadHeapStats();
  CHECK(purged.free_bytes < before.free_bytes + 4 * kMiB);
}
#else
TEST_CASE("allocator: without jemalloc (sanitizer builds) it is named, reports nothing and purges nothing") {
  CHECK(AllocatorName() == "libc malloc");
  const HeapStats s = ReadHeapStats();
  CHECK(s.in_use_bytes == 0);
  CHECK(s.free_bytes == 0);
  ReturnFreeHeapToKernel();
}
#endif

}  // namespace
}  // namespace shardcache
