#include "daemon/serve/batch_ring.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <new>

namespace shardcache::serve {

using batch_ring::RingEntry;
using batch_ring::RingHeader;
using batch_ring::RingSample;

Result<std::unique_ptr<BatchRing>> BatchRing::Create(uint32_t entries, uint32_t max_samples) {
  if (entries == 0 || max_samples == 0) {
    return InvalidArgument("a batch ring needs at least one entry of at least one sample");
  }
  const uint64_t bytes = batch_ring::RingBytes(entries, max_samples);
  if (bytes > batch_ring::kMaxRingBytes) {
    return InvalidArgument("a batch ring of " + std::to_string(entries) + " batches of " +
                           std::to_string(max_samples) + " samples would take " + std::to_string(bytes) +
                           " bytes (limit " + std::to_string(batch_ring::kMaxRingBytes) + "): batch_size is too large");
  }
  std::unique_ptr<BatchRing> r(new BatchRing());
  r->entries_ = entries;
  r->max_samples_ = max_samples;
  r->stride_ = batch_ring::Stride(max_samples);
  r->bytes_ = bytes;
  r->fd_.Reset(memfd_create("shardcache-batch-ring", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!r->fd_.valid()) return ErrnoStatus(errno, "memfd_create for a batch ring");
  if (ftruncate(r->fd_.get(), static_cast<off_t>(bytes)) != 0) {
    return ErrnoStatus(errno, "ftruncate of a batch ring to " + std::to_string(bytes));
  }
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, r->fd_.get(), 0);
  if (p == MAP_FAILED) return ErrnoStatus(errno, "mmap of a batch ring");
  r->base_ = static_cast<uint8_t*>(p);
  // Nobody can resize it under us, and (F_SEAL_FUTURE_WRITE, Linux 5.1) the client can map it
  // only read-only; this mapping stays writable.
  if (fcntl(r->fd_.get(), F_ADD_SEALS, F_SEAL_GROW | F_SEAL_SHRINK | F_SEAL_FUTURE_WRITE | F_SEAL_SEAL) != 0 &&
      fcntl(r->fd_.get(), F_ADD_SEALS, F_SEAL_GROW | F_SEAL_SHRINK | F_SEAL_SEAL) != 0) {
    return ErrnoStatus(errno, "sealing a batch ring");
  }
  auto* h = new (r->base_) RingHeader{};
  h->magic = batch_ring::kMagic;
  h->layout_version = batch_ring::kLayoutVersion;
  h->entries = entries;
  h->max_samples = max_samples;
  h->stride = r->stride_;
  h->published.store(0, std::memory_order_release);
  for (uint32_t i = 0; i < entries; ++i) {
    new (r->base_ + batch_ring::EntryOffset(i, entries, r->stride_)) RingEntry{};
  }
  return r;
}

BatchRing::~BatchRing() {
  if (base_ != nullptr) munmap(base_, bytes_);
}

void BatchRing::Publish(uint32_t slot, uint64_t batch_seq, uint64_t rank_consumed, const AssembledBatch& batch) {
  const uint64_t i = published_;
  uint8_t* at = base_ + batch_ring::EntryOffset(i, entries_, stride_);
  auto* e = reinterpret_cast<RingEntry*>(at);
  e->index.store(batch_ring::kWriting, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);  // kWriting is visible before any field changes
  const auto n = static_cast<uint32_t>(batch.sample_ids.size());
  e->slot = slot;
  e->samples = n;
  e->payload_bytes = batch.payload_bytes;
  e->batch_seq = batch_seq;
  e->rank_consumed = rank_consumed;
  e->fields_offset = batch.fields_offset;
  e->fields_bytes = batch.fields_bytes;
  auto* s = reinterpret_cast<RingSample*>(at + sizeof(RingEntry));
  for (uint32_t k = 0; k < n; ++k) s[k] = {batch.sample_ids[k], batch.offsets[k], batch.lengths[k]};
  e->index.store(i, std::memory_order_release);
  published_ = i + 1;
  reinterpret_cast<RingHeader*>(base_)->published.store(published_, std::memory_order_release);
}

}  // namespace shardcache::serve
