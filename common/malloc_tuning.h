// Process-wide allocator tuning for programs that move chunk-sized (MiB) buffers.
//
// glibc serves allocations above M_MMAP_THRESHOLD (128 KiB by default, adapting up to 32 MiB)
// with a fresh mmap, and returns them with munmap: every 4 MiB chunk buffer then costs ~1,000
// page faults on first touch. On virtual machines a page fault is expensive (measured here:
// page faults were the largest single cost of both `shardctl fetch` and a cache-hit epoch).
// Keeping large buffers in the heap lets freed chunk buffers be reused without new faults.
#pragma once

namespace shardcache {

// Call once at the start of main(), before threads start. Safe to call more than once.
void KeepLargeBuffersInHeap();

}  // namespace shardcache
