#include "shardcache/batch_ring.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <new>
#include <string>

namespace shardcache::batch_ring {

// ---- RingWriter

Result<std::unique_ptr<RingWriter>> RingWriter::Create(uint32_t entries, uint32_t max_samples) {
  if (entries == 0 || max_samples == 0) {
    return InvalidArgument("a batch ring needs at least one entry of at least one sample");
  }
  const uint64_t bytes = RingBytes(entries, max_samples);
  if (bytes > kMaxRingBytes) {
    return InvalidArgument("a batch ring of " + std::to_string(entries) + " batches of " +
                           std::to_string(max_samples) + " samples would take " + std::to_string(bytes) +
                           " bytes (limit " + std::to_string(kMaxRingBytes) + "): batch_size is too large");
  }
  std::unique_ptr<RingWriter> r(new RingWriter());
  r->entries_ = entries;
  r->max_samples_ = max_samples;
  r->stride_ = Stride(max_samples);
  r->bytes_ = bytes;
  r->fd_ = memfd_create("shardcache-batch-ring", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (r->fd_ < 0) return ErrnoStatus(errno, "memfd_create for a batch ring");
  if (ftruncate(r->fd_, static_cast<off_t>(bytes)) != 0) {
    return ErrnoStatus(errno, "ftruncate of a batch ring to " + std::to_string(bytes));
  }
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, r->fd_, 0);
  if (p == MAP_FAILED) return ErrnoStatus(errno, "mmap of a batch ring");
  r->base_ = static_cast<uint8_t*>(p);
  // Nobody can resize it under us, and (F_SEAL_FUTURE_WRITE, Linux 5.1) the client can map it
  // only read-only; this mapping stays writable.
  if (fcntl(r->fd_, F_ADD_SEALS, F_SEAL_GROW | F_SEAL_SHRINK | F_SEAL_FUTURE_WRITE | F_SEAL_SEAL) != 0 &&
      fcntl(r->fd_, F_ADD_SEALS, F_SEAL_GROW | F_SEAL_SHRINK | F_SEAL_SEAL) != 0) {
    return ErrnoStatus(errno, "sealing a batch ring");
  }
  auto* h = new (r->base_) RingHeader{};
  h->magic = kMagic;
  h->layout_version = kLayoutVersion;
  h->entries = entries;
  h->max_samples = max_samples;
  h->stride = r->stride_;
  h->published.store(0, std::memory_order_release);
  for (uint32_t i = 0; i < entries; ++i) new (r->base_ + EntryOffset(i, entries, r->stride_)) RingEntry{};
  return r;
}

RingWriter::~RingWriter() {
  if (base_ != nullptr) munmap(base_, bytes_);
  if (fd_ >= 0) close(fd_);
}

void RingWriter::Publish(const EntryHead& head, std::span<const uint64_t> ids, std::span<const uint64_t> offsets,
                         std::span<const uint64_t> lengths) {
  const uint64_t i = published_;
  uint8_t* at = base_ + EntryOffset(i, entries_, stride_);
  auto* e = reinterpret_cast<RingEntry*>(at);
  e->index.store(kWriting, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);  // kWriting is visible before any field changes
  const auto n = static_cast<uint32_t>(ids.size());
  e->slot = head.slot;
  e->samples = n;
  e->payload_bytes = head.payload_bytes;
  e->batch_seq = head.batch_seq;
  e->rank_consumed = head.rank_consumed;
  e->fields_offset = head.fields_offset;
  e->fields_bytes = head.fields_bytes;
  auto* s = reinterpret_cast<RingSample*>(at + sizeof(RingEntry));
  for (uint32_t k = 0; k < n; ++k) s[k] = {ids[k], offsets[k], lengths[k]};
  e->index.store(i, std::memory_order_release);
  published_ = i + 1;
  reinterpret_cast<RingHeader*>(base_)->published.store(published_, std::memory_order_release);
}

// ---- RingReader

RingReader::~RingReader() {
  if (base_ != nullptr) munmap(const_cast<uint8_t*>(base_), bytes_);
}

RingReader& RingReader::operator=(RingReader&& o) noexcept {
  if (this != &o) {
    if (base_ != nullptr) munmap(const_cast<uint8_t*>(base_), bytes_);
    base_ = o.base_;
    bytes_ = o.bytes_;
    entries_ = o.entries_;
    max_samples_ = o.max_samples_;
    stride_ = o.stride_;
    o.base_ = nullptr;
  }
  return *this;
}

Result<RingReader> RingReader::Map(int fd, uint64_t bytes, uint32_t entries, uint32_t min_samples) {
  if (fd < 0) return DataLoss("shardcached did not pass the batch ring");
  struct stat st {};
  if (fstat(fd, &st) != 0 || bytes < sizeof(RingHeader) || static_cast<uint64_t>(st.st_size) < bytes) {
    close(fd);
    return DataLoss("shardcached passed a batch ring of " + std::to_string(st.st_size) + " bytes for " +
                    std::to_string(bytes));
  }
  void* p = mmap(nullptr, bytes, PROT_READ, MAP_SHARED, fd, 0);
  const int err = errno;
  close(fd);
  if (p == MAP_FAILED) return Internal(std::string("mapping the batch ring: ") + std::strerror(err));
  RingReader r;
  r.base_ = static_cast<const uint8_t*>(p);
  r.bytes_ = bytes;
  const auto& h = *reinterpret_cast<const RingHeader*>(r.base_);
  r.entries_ = h.entries;
  r.max_samples_ = h.max_samples;
  r.stride_ = h.stride;
  if (h.magic != kMagic || h.layout_version != kLayoutVersion || r.entries_ == 0 || r.entries_ != entries ||
      r.max_samples_ < min_samples || r.stride_ != Stride(r.max_samples_) ||
      RingBytes(r.entries_, r.max_samples_) > bytes) {
    return DataLoss("shardcached described an inconsistent batch ring");
  }
  return r;
}

uint64_t RingReader::published() const {
  return reinterpret_cast<const RingHeader*>(base_)->published.load(std::memory_order_acquire);
}

Status RingReader::Read(uint64_t i, BatchDescription* out) const {
  const uint64_t published_now = published();
  if (published_now <= i) {
    return DataLoss("batch ring entry " + std::to_string(i) + " is not published (" + std::to_string(published_now) +
                    " are)");
  }
  if (published_now - i > entries_) {
    return DataLoss("batch ring overran: entry " + std::to_string(i) + " was overwritten (" +
                    std::to_string(published_now) + " published)");
  }
  // Seqlock read: the entry's index before and after the copy must both be i.
  const uint8_t* at = base_ + EntryOffset(i, entries_, stride_);
  const auto& e = *reinterpret_cast<const RingEntry*>(at);
  if (e.index.load(std::memory_order_acquire) != i) {
    return DataLoss("batch ring entry " + std::to_string(i) + " is not there");
  }
  out->slot = e.slot;
  const uint32_t n = e.samples;
  out->payload_bytes = e.payload_bytes;
  out->batch_seq = e.batch_seq;
  out->rank_consumed = e.rank_consumed;
  out->fields_offset = e.fields_offset;
  out->fields_bytes = e.fields_bytes;
  if (n > max_samples_) return DataLoss("shardcached sent an inconsistent batch description");
  const auto* samples = reinterpret_cast<const RingSample*>(at + sizeof(RingEntry));
  out->ids.resize(n);
  out->offsets.resize(n);
  out->lengths.resize(n);
  for (uint32_t k = 0; k < n; ++k) {
    out->ids[k] = samples[k].id;
    out->offsets[k] = samples[k].offset;
    out->lengths[k] = samples[k].length;
  }
  std::atomic_thread_fence(std::memory_order_acquire);
  if (e.index.load(std::memory_order_relaxed) != i) {
    return DataLoss("batch ring entry " + std::to_string(i) + " changed while it was read");
  }
  for (uint32_t k = 0; k < n; ++k) {
    if (out->offsets[k] > out->payload_bytes || out->lengths[k] > out->payload_bytes - out->offsets[k]) {
      return DataLoss("shardcached sent a sample range outside its batch");
    }
  }
  return Status::Ok();
}

}  // namespace shardcache::batch_ring
