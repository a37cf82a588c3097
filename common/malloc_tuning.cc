#include "common/malloc_tuning.h"

#include <malloc.h>

namespace shardcache {

void KeepLargeBuffersInHeap() {
  // Buffers up to 256 MiB come from the heap; freed memory is trimmed back to the kernel only
  // when more than 1 GiB sits unused at the top of the heap.
  mallopt(M_MMAP_THRESHOLD, 256 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
}

void ReturnFreeHeapToKernel() { malloc_trim(0); }

}  // namespace shardcache
