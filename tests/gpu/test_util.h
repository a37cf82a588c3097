// Helpers shared by the cuda tests: backend selection for the host and [gpu] variants of each
// case, a memfd-backed arena like the daemon's, random data and device→host readback.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "gpu/device.h"
#include "gpu/stager.h"

namespace shardcache::gpu::testing {

// The device for a test variant: the host backend, or a CUDA device that must exist (the [gpu]
// variants only run where tests/gpu/run_on_device.sh runs them, on a machine with a GPU).
inline Device OpenDevice(bool cuda) {
  DeviceOptions o;
  o.select = cuda ? DeviceOptions::Select::kCuda : DeviceOptions::Select::kHost;
  auto d = Device::Open(o);
  if (!d.ok()) throw std::runtime_error("opening the device: " + d.status().ToString());
  return *d;
}

// Shared memory like the daemon's arena: memfd, MAP_SHARED.
class MemfdArena {
 public:
  explicit MemfdArena(size_t bytes) : bytes_(bytes) {
    fd_ = memfd_create("shardcache-test-arena", MFD_CLOEXEC);
    if (fd_ < 0 || ftruncate(fd_, static_cast<off_t>(bytes)) != 0) throw std::runtime_error("memfd");
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
    if (p == MAP_FAILED) throw std::runtime_error("mmap");
    data_ = static_cast<uint8_t*>(p);
  }
  ~MemfdArena() {
    munmap(data_, bytes_);
    close(fd_);
  }
  MemfdArena(const MemfdArena&) = delete;
  MemfdArena& operator=(const MemfdArena&) = delete;
  uint8_t* data() const { return data_; }
  size_t bytes() const { return bytes_; }

 private:
  size_t bytes_;
  int fd_ = -1;
  uint8_t* data_ = nullptr;
};

inline std::vector<uint8_t> RandomBytes(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; i += 8) {
    uint64_t r = rng();
    std::memcpy(v.data() + i, &r, std::min<size_t>(8, n - i));
  }
  return v;
}

// Copies `bytes` of device memory (after `ready`, if given) into a host vector.
inline std::vector<uint8_t> ToHost(const Device& device, const void* src, size_t bytes,
                                   const Event* ready = nullptr) {
  auto stream = Stream::Create(device);
  if (!stream.ok()) throw std::runtime_error(stream.status().ToString());
  if (ready != nullptr) {
    Status st = stream->WaitEvent(*ready);
    if (!st.ok()) throw std::runtime_error(st.ToString());
  }
  std::vector<uint8_t> out(bytes);
  Status st = CopyAsync(*stream, out.data(), src, bytes, CopyKind::kDeviceToHost);
  if (st.ok()) st = stream->Synchronize();
  if (!st.ok()) throw std::runtime_error(st.ToString());
  return out;
}

// Uploads host bytes into a new device buffer (synchronously).
inline DeviceBuffer ToDevice(const Device& device, const void* src, size_t bytes) {
  auto buf = DeviceBuffer::Allocate(device, bytes);
  auto stream = Stream::Create(device);
  if (!buf.ok() || !stream.ok()) throw std::runtime_error("device allocation");
  Status st = CopyAsync(*stream, buf->data(), src, bytes, CopyKind::kHostToDevice);
  if (st.ok()) st = stream->Synchronize();
  if (!st.ok()) throw std::runtime_error(st.ToString());
  return std::move(*buf);
}

// A stand-in for the daemon + loader: batches are written into slots of a memfd arena, each slot
// is handed out until its release callback runs, and is scribbled over (0xEE) on release — so a
// release that came before the copy corrupts what the device received and the comparison fails.
class FakeArenaLoader {
 public:
  // `batches` batches of `records` records of `record_bytes` bytes (ids from `ids` when given,
  // else consecutive), over an arena of `slots` slots.
  FakeArenaLoader(MemfdArena& arena, size_t slots, uint64_t record_bytes, uint64_t records, size_t batches,
                  std::vector<int64_t> ids = {})
      : arena_(arena), slot_bytes_(arena.bytes() / slots), record_bytes_(record_bytes), records_(records),
        batches_(batches), ids_(std::move(ids)) {
    for (size_t i = 0; i < slots; ++i) free_.push_back(i);
  }

  // Bytes of record `id` (a pure function of the id).
  std::vector<uint8_t> Record(int64_t id) const { return RandomBytes(record_bytes_, 1000 + id); }
  std::vector<uint8_t> Expected(size_t batch) const {
    std::vector<uint8_t> out;
    for (uint64_t r = 0; r < records_; ++r) {
      auto rec = Record(IdOf(batch, r));
      out.insert(out.end(), rec.begin(), rec.end());
    }
    return out;
  }
  int64_t IdOf(size_t batch, uint64_t r) const {
    size_t k = batch * records_ + r;
    return ids_.empty() ? static_cast<int64_t>(k) : ids_[k];
  }

  HostBatchSource Source() {
    return [this]() -> shardcache::Result<std::optional<HostBatch>> {
      std::unique_lock<std::mutex> lock(mu_);
      ++source_calls_;
      if (next_ == batches_) return std::optional<HostBatch>();
      cv_.wait(lock, [&] { return !free_.empty(); });
      size_t slot = free_.back();
      free_.pop_back();
      size_t b = next_++;
      lock.unlock();
      uint8_t* p = arena_.data() + slot * slot_bytes_;
      auto bytes = Expected(b);
      std::memcpy(p, bytes.data(), bytes.size());
      HostBatch hb;
      hb.data = p;
      hb.bytes = bytes.size();
      hb.records = records_;
      hb.record_bytes = record_bytes_;
      for (uint64_t r = 0; r < records_; ++r) hb.sample_ids.push_back(IdOf(b, r));
      hb.release = [this, slot, b, p] {
        std::memset(p, 0xEE, slot_bytes_);
        std::lock_guard<std::mutex> l(mu_);
        release_order_.push_back(b);
        release_threads_.push_back(std::this_thread::get_id());
        free_.push_back(slot);
        cv_.notify_all();
      };
      return std::optional<HostBatch>(std::move(hb));
    };
  }

  size_t source_calls() { std::lock_guard<std::mutex> l(mu_); return source_calls_; }
  size_t handed_out() { std::lock_guard<std::mutex> l(mu_); return next_; }
  std::vector<size_t> release_order() { std::lock_guard<std::mutex> l(mu_); return release_order_; }
  std::vector<std::thread::id> release_threads() { std::lock_guard<std::mutex> l(mu_); return release_threads_; }

 private:
  MemfdArena& arena_;
  const uint64_t slot_bytes_, record_bytes_, records_;
  const size_t batches_;
  const std::vector<int64_t> ids_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<size_t> free_;
  size_t next_ = 0, source_calls_ = 0;
  std::vector<size_t> release_order_;
  std::vector<std::thread::id> release_threads_;
};

}  // namespace shardcache::gpu::testing
