#include "daemon/cache/scratch_pool.h"

#include <algorithm>

namespace shardcache::cache {
namespace {

// Smallest buffer the pool allocates, so that buffers grown for one read serve the next ones.
constexpr uint64_t kMinBufferBytes = 256 << 10;

}  // namespace

ScratchPool::Lease ScratchPool::Borrow(uint64_t bytes) {
  if (bytes == 0) return Lease(nullptr, AlignedBuffer());
  if (bytes > max_buffer_bytes_) return Lease(nullptr, AlignedBuffer(bytes));
  AlignedBuffer buffer;
  {
    MutexLock lock(&mu_);
    if (!free_.empty()) {
      buffer = std::move(free_.back());
      free_.pop_back();
    }
  }
  if (buffer.capacity() < bytes) buffer = AlignedBuffer(std::max(bytes, std::min(kMinBufferBytes, max_buffer_bytes_)));
  return Lease(this, std::move(buffer));
}

void ScratchPool::GiveBack(AlignedBuffer buffer) {
  MutexLock lock(&mu_);
  if (free_.size() < max_pooled_) free_.push_back(std::move(buffer));
}

size_t ScratchPool::pooled() const {
  MutexLock lock(&mu_);
  return free_.size();
}

}  // namespace shardcache::cache
