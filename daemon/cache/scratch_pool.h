// ScratchPool: a few aligned scratch buffers that short reads borrow and give back, so that the
// NVMe tier's bounce buffers and table pages are neither allocated per read nor kept per thread.
//
// Per-read allocations (millions of short-lived 4 KiB-aligned buffers a minute) made the malloc
// arenas grow by fragmentation; one buffer kept per reading thread then held up to 1 MiB in each
// of the ~50 threads that ever read (a soak measured the live heap 14 -> 45 MiB). The pool keeps
// at most `max_pooled` buffers of at most `max_buffer_bytes` between reads; a read finding none
// free, or needing more, allocates a buffer of its own for that read only.
//
// Thread safety: Borrow() and the leases it returns may be used from any thread.
#pragma once

#include <cstdint>
#include <vector>

#include "common/fs.h"
#include "common/mutex.h"

namespace shardcache::cache {

class ScratchPool {
 public:
  ScratchPool(uint32_t max_pooled, uint64_t max_buffer_bytes)
      : max_pooled_(max_pooled), max_buffer_bytes_(max_buffer_bytes) {}

  // A buffer of at least the asked size (none for 0 bytes: data() is null), returned to the pool
  // when the lease ends if there is room and it is not oversized.
  class Lease {
   public:
    Lease(Lease&& other) noexcept : pool_(other.pool_), buffer_(std::move(other.buffer_)) { other.pool_ = nullptr; }
    Lease& operator=(Lease&&) = delete;
    ~Lease() {
      if (pool_ != nullptr) pool_->GiveBack(std::move(buffer_));
    }
    uint8_t* data() { return buffer_.data(); }

   private:
    friend class ScratchPool;
    Lease(ScratchPool* pool, AlignedBuffer buffer) : pool_(pool), buffer_(std::move(buffer)) {}
    ScratchPool* pool_;
    AlignedBuffer buffer_;
  };

  Lease Borrow(uint64_t bytes);

  // Buffers waiting in the pool (tests).
  size_t pooled() const;

 private:
  void GiveBack(AlignedBuffer buffer);

  const uint32_t max_pooled_;
  const uint64_t max_buffer_bytes_;
  mutable Mutex mu_;
  std::vector<AlignedBuffer> free_ GUARDED_BY(mu_);
};

}  // namespace shardcache::cache
