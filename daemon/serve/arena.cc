#include "daemon/serve/arena.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace shardcache::serve {
namespace {

// Create faults in this much of the arena: the same stretch (kPrefaultStep) of every slot,
// then the next one. 64 MiB is the first 4 MiB of 16 slots.
constexpr uint64_t kCreatePrefaultBytes = 64 << 20;
constexpr uint64_t kPrefaultStep = 256 << 10;

}  // namespace

Result<std::unique_ptr<Arena>> Arena::Create(uint64_t arena_bytes, uint32_t slot_count) {
  if (slot_count == 0) return InvalidArgument("arena slot count must be at least 1");
  const uint64_t slot_bytes = AlignDown(arena_bytes / slot_count, kDirectIoAlign);
  if (slot_bytes < kDirectIoAlign) {
    return InvalidArgument("arena of " + std::to_string(arena_bytes) + " bytes split into " +
                           std::to_string(slot_count) + " slots leaves slots under 4 KiB");
  }
  std::unique_ptr<Arena> a(new Arena());
  a->slot_count_ = slot_count;
  a->slot_bytes_ = slot_bytes;
  a->arena_bytes_ = slot_bytes * slot_count;
  a->fd_.Reset(memfd_create("shardcache-arena", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!a->fd_.valid()) return ErrnoStatus(errno, "memfd_create for the batch arena");
  if (ftruncate(a->fd_.get(), static_cast<off_t>(a->arena_bytes_)) != 0) {
    return ErrnoStatus(errno, "ftruncate of the batch arena to " + std::to_string(a->arena_bytes_));
  }
  // The client may map it writable (it never writes), but can never resize it under us.
  if (fcntl(a->fd_.get(), F_ADD_SEALS, F_SEAL_GROW | F_SEAL_SHRINK | F_SEAL_SEAL) != 0) {
    return ErrnoStatus(errno, "sealing the batch arena");
  }
  void* p = mmap(nullptr, a->arena_bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, a->fd_.get(), 0);
  if (p == MAP_FAILED) return ErrnoStatus(errno, "mmap of the batch arena");
  a->base_ = static_cast<uint8_t*>(p);
  {
    // Not shared yet; the locks are taken for the analysis.
    MutexLock l(&a->mu_);
    a->slots_.resize(slot_count);
  }
  {
    MutexLock l(&a->prefault_mu_);
    a->faulted_front_.resize(slot_count);
  }
  a->PrefaultFronts(a->slot_bytes_, kCreatePrefaultBytes);
  return a;
}

void Arena::PrefaultFronts(uint64_t front_bytes, uint64_t max_bytes) {
  MutexLock l(&prefault_mu_);
  // Whole pages (slot_bytes_ is a multiple of them): a later, longer front then starts where
  // madvise accepts it, on a page boundary.
  const uint64_t front = AlignUp(std::min(front_bytes, slot_bytes_), kDirectIoAlign);
  for (uint64_t off = 0; off < front; off += kPrefaultStep) {
    const uint64_t end = std::min(off + kPrefaultStep, front);
    for (uint32_t slot = 0; slot < slot_count_; ++slot) {
      if (prefaulted_bytes_ >= max_bytes) return;
      uint64_t& done = faulted_front_[slot];
      if (done >= end) continue;
      // Only faults pages in (no write: a slot in use keeps its bytes). EINVAL: a kernel
      // before 5.14. ENOMEM and the like: memory is short, and the batches that need it will
      // say so. Either way pages are then faulted on first use.
      if (madvise(SlotData(slot) + done, end - done, MADV_POPULATE_WRITE) != 0) {
        spdlog::debug("arena: prefault stopped after {} bytes: {}", prefaulted_bytes_, std::strerror(errno));
        return;
      }
      prefaulted_bytes_ += end - done;
      done = end;
    }
  }
}

uint64_t Arena::prefaulted_bytes() const {
  MutexLock l(&prefault_mu_);
  return prefaulted_bytes_;
}

Arena::~Arena() {
  if (base_ != nullptr) munmap(base_, arena_bytes_);
}

std::optional<uint32_t> Arena::TryAcquire(uint64_t owner) {
  MutexLock l(&mu_);
  for (uint32_t i = 0; i < slot_count_; ++i) {
    if (slots_[i].state == SlotState::kFree) {
      slots_[i] = {SlotState::kAssembling, owner};
      return i;
    }
  }
  return std::nullopt;
}

void Arena::MarkDelivered(uint32_t slot) {
  MutexLock l(&mu_);
  slots_[slot].state = SlotState::kDelivered;
}

Status Arena::Release(uint32_t slot, uint64_t owner) {
  {
    MutexLock l(&mu_);
    if (slot >= slot_count_) {
      return FailedPrecondition("slot " + std::to_string(slot) + " does not exist (arena has " +
                                std::to_string(slot_count_) + ")");
    }
    Slot& s = slots_[slot];
    if (s.state == SlotState::kFree || s.owner != owner) {
      return FailedPrecondition("slot " + std::to_string(slot) + " is not held by loader " +
                                std::to_string(owner));
    }
    s = Slot{};
  }
  freed_.NotifyAll();
  return Status::Ok();
}

uint32_t Arena::ReleaseAll(uint64_t owner) {
  uint32_t n = 0;
  {
    MutexLock l(&mu_);
    for (auto& s : slots_) {
      if (s.state != SlotState::kFree && s.owner == owner) {
        s = Slot{};
        ++n;
      }
    }
  }
  if (n) freed_.NotifyAll();
  return n;
}

uint32_t Arena::FreeSlots() const {
  MutexLock l(&mu_);
  uint32_t n = 0;
  for (const auto& s : slots_) n += s.state == SlotState::kFree;
  return n;
}

uint32_t Arena::SlotsIn(SlotState state, uint64_t owner) const {
  MutexLock l(&mu_);
  uint32_t n = 0;
  for (const auto& s : slots_) n += s.state == state && s.owner == owner;
  return n;
}

uint32_t Arena::DeliveredSlots() const {
  MutexLock l(&mu_);
  uint32_t n = 0;
  for (const auto& s : slots_) n += s.state == SlotState::kDelivered;
  return n;
}

bool Arena::WaitForFree(std::chrono::steady_clock::time_point deadline) {
  MutexLock l(&mu_);
  return freed_.WaitUntil(&mu_, deadline, [&]() REQUIRES(mu_) {
    for (const auto& s : slots_) if (s.state == SlotState::kFree) return true;
    return false;
  });
}

void Arena::NotifyAll() { freed_.NotifyAll(); }

}  // namespace shardcache::serve
