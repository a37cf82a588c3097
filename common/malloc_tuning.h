// Process-wide allocator tuning for programs that move chunk-sized (MiB) buffers.
//
// glibc serves allocations above M_MMAP_THRESHOLD (128 KiB by default, adapting up to 32 MiB)
// with a fresh mmap, and returns them with munmap: every 4 MiB chunk buffer then costs ~1,000
// page faults on first touch. On virtual machines a page fault is expensive (measured here:
// page faults were the largest single cost of both `shardctl fetch` and a cache-hit epoch).
// Keeping large buffers in the heap lets freed chunk buffers be reused without new faults.
#pragma once

namespace shardcache {

// Malloc arenas a process uses at most (see KeepLargeBuffersInHeap).
inline constexpr int kMallocArenas = 4;

// Call once at the start of main(), before threads start. Safe to call more than once. Also
// caps the malloc arenas at kMallocArenas.
void KeepLargeBuffersInHeap();

// Returns the free memory of every malloc arena to the kernel (malloc_trim). With large buffers
// kept in the heap, a process otherwise keeps the peak of a burst resident (a soak measured
// 145 MiB of free heap resident in an idle node after 3 minutes of jobs): call it when a burst of
// work is over — the last client gone, the last stream ended — not on the data path.
void ReturnFreeHeapToKernel();

}  // namespace shardcache
