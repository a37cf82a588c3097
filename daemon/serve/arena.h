// Arena: the shared-memory data plane of one client connection.
//
// One memfd (MFD_CLOEXEC | MFD_ALLOW_SEALING), sized with ftruncate and sealed against growing
// and shrinking (so a client can never SIGBUS the daemon by truncating it), mapped once in the
// daemon and handed to the client with SCM_RIGHTS. Nothing is created in /dev/shm: the kernel
// frees the memory when the last descriptor and mapping are gone, also when a client crashes.
//
// The arena is split into `slot_count` equal slots of `slot_bytes` (arena bytes / slots, rounded
// down to 4 KiB so that every slot start is aligned for O_DIRECT reads). A slot holds one batch
// and has one owner at a time: free → assembling (a loader's prefetcher fills it) → delivered
// (the client holds it) → free again on ReleaseBatch, CloseLoader or disconnect.
//
// Create faults in the front of every slot (batches fill slots from their start; 64 MiB in
// all, breadth first), so that a new trainer's first batches are not assembled at page-fault
// speed: a 1 MiB batch into untouched memory costs 256 faults, milliseconds on a virtual
// machine. Opening a loader faults in the front its batches need of every slot
// (PrefaultFronts, up to a quarter GiB of the arena in all). The rest is faulted on first use,
// so a client never commits memory its batches do not use. On kernels without
// MADV_POPULATE_WRITE (before 5.14) every page is faulted on first use.
//
// Thread safety: all methods are safe to call concurrently; slot state is guarded by mu_.
// Slot memory itself is written only by the slot's current owner.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "common/fs.h"
#include "common/mutex.h"
#include "common/status.h"

namespace shardcache::serve {

class Arena {
 public:
  enum class SlotState : uint8_t { kFree, kAssembling, kDelivered };

  // InvalidArgument when slot_count is 0 or the slots would be smaller than 4 KiB;
  // ResourceExhausted / Internal when memfd, ftruncate, sealing or mmap fail.
  static Result<std::unique_ptr<Arena>> Create(uint64_t arena_bytes, uint32_t slot_count);
  ~Arena();
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;

  int fd() const { return fd_.get(); }
  uint64_t arena_bytes() const { return arena_bytes_; }
  uint32_t slot_count() const { return slot_count_; }
  uint64_t slot_bytes() const { return slot_bytes_; }
  uint8_t* SlotData(uint32_t slot) const { return base_ + uint64_t{slot} * slot_bytes_; }
  uint64_t SlotOffset(uint32_t slot) const { return uint64_t{slot} * slot_bytes_; }
  // Bytes faulted in ahead of use (by Create and PrefaultFronts).
  uint64_t prefaulted_bytes() const;
  // Faults in the first `front_bytes` of every slot, a stretch of every slot at a time, until
  // `max_bytes` of the arena are faulted in all (counting what was before). Safe while slots
  // are in use: it writes nothing. One MADV_POPULATE_WRITE costs a fraction of the page faults
  // it saves a batch being assembled (measured on a 2-core VM: 1.3 us against 16 us a page).
  void PrefaultFronts(uint64_t front_bytes, uint64_t max_bytes);

  // Takes a free slot for `owner` (a loader id), marking it assembling; nullopt when none is
  // free. Never blocks.
  std::optional<uint32_t> TryAcquire(uint64_t owner);
  // assembling → delivered. REQUIRES: the slot is assembling.
  void MarkDelivered(uint32_t slot);
  // Frees a slot that `owner` holds. FailedPrecondition when the slot is out of range, free, or
  // held by another owner (a client releasing what it does not hold).
  Status Release(uint32_t slot, uint64_t owner);
  // Frees every slot held by `owner`; returns how many.
  uint32_t ReleaseAll(uint64_t owner);

  uint32_t FreeSlots() const;
  uint32_t SlotsIn(SlotState state, uint64_t owner) const;
  uint32_t DeliveredSlots() const;
  // Blocks until some slot is free or `deadline` passes; true when one is free.
  bool WaitForFree(std::chrono::steady_clock::time_point deadline);
  // Wakes waiters (used when shutting down).
  void NotifyAll();

 private:
  Arena() = default;
  struct Slot {
    SlotState state = SlotState::kFree;
    uint64_t owner = 0;
  };

  UniqueFd fd_;
  uint8_t* base_ = nullptr;
  uint64_t arena_bytes_ = 0;
  uint32_t slot_count_ = 0;
  uint64_t slot_bytes_ = 0;

  mutable Mutex prefault_mu_;
  uint64_t prefaulted_bytes_ GUARDED_BY(prefault_mu_) = 0;
  std::vector<uint64_t> faulted_front_ GUARDED_BY(prefault_mu_);  // per slot

  mutable Mutex mu_;
  CondVar freed_;
  std::vector<Slot> slots_ GUARDED_BY(mu_);
};

}  // namespace shardcache::serve
