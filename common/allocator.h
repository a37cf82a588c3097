// The process's memory allocator: which one it is, its statistics, and handing free memory back
// to the kernel — for programs that move chunk-sized (64 KiB-4 MiB) buffers.
//
// shardcached and shardctl link jemalloc (Debian's libjemalloc2; RocksDB's recommended
// allocator). The options in allocator.cc apply where this file is linked in (shardcached, whose
// startup log names the allocator); shardctl runs on jemalloc's defaults. Sanitizer and fuzzing
// builds use their runtime's malloc instead, and there these functions report nothing and do
// nothing. Why not glibc malloc: a node's heap mixes long-lived
// DRAM-tier runs and chunks with short-lived message buffers of the same sizes. glibc serves
// such sizes with a fresh mmap each (every 4 MiB buffer then cost ~1,000 page faults on first
// touch, the largest single cost of `shardctl fetch` and of a cache-hit epoch on a VM), or, tuned
// to keep them in its heap, leaves holes between the two kinds that it can neither reuse for
// larger requests nor return. Measured on a cold 1 GiB global epoch (DRAM tier and prefetch
// 256 MiB each, bench default link, 2-core VM), tuned glibc against jemalloc as configured in
// allocator.cc: the node's peak RSS 1.43-2.07 GB (about half of it free heap in holes:
// malloc_trim mid-epoch took 1.56 GB to 0.73) against 0.91-0.96 GB, page faults 354-510k against
// 241-250k, node CPU 6.0-9.4 s against 5.4-7.4 s, the same goodput.
#pragma once

#include <cstdint>
#include <string>

namespace shardcache {

// "jemalloc <version>, <n> arenas", or "libc malloc" where the program was built without it.
std::string AllocatorName();

struct HeapStats {
  uint64_t in_use_bytes = 0;  // in live allocations
  uint64_t free_bytes = 0;    // resident, held by the allocator for reuse, not in live allocations
};
// jemalloc's own accounting (all zero without it). Takes a snapshot of every arena: about 10 us
// with 300 threads (measured), fine for each scrape, not for the data path.
HeapStats ReadHeapStats();

// Returns the free memory of every arena to the kernel at once; jemalloc otherwise returns it
// over the following seconds, and only while the process keeps allocating, so an idle process
// would keep the peak of its last burst resident. Call it when a burst of work is over — the
// last client gone, the last stream ended — not on the data path.
void ReturnFreeHeapToKernel();

}  // namespace shardcache
