// Stager: moves host batches from the shared-memory arena into GPU memory ahead of the trainer.
//
// A worker thread pulls host batches from a source (the loader), copies each into one of
// `depth` device buffers with cudaMemcpyAsync on the stager's own stream, runs the loader's
// fused conversion (Converter) on the same stream and records a ready event. The trainer
// takes DeviceBatch objects in order with Next() and makes its own stream wait on the ready
// event (WaitOn or the DLPack export) — the host never waits for a copy. With depth 2, batch
// k+1 is copied while the trainer computes on batch k.
//
//   source ─▶ worker: free slot ─▶ H2D copy ─▶ convert ─▶ ready event ─▶ Next() ─▶ trainer stream
//                                     │ (copy done: cudaLaunchHostFunc)
//                                     ▼
//                        release queue ─▶ release thread ─▶ HostBatch::release (arena slot back)
//
// Arena: the whole arena is registered once (cudaHostRegister) so copies run at pinned speed
// straight from shared memory; if registration fails, or a batch lies outside the arena, the
// stager copies through a pinned bounce buffer per slot and logs once that it does so.
// A host batch's release callback runs only after its bytes have been copied, and never on a
// CUDA callback thread: callbacks only queue, the stager's release thread calls it (so it may
// talk to the daemon socket).
// A device slot is reused only after its DeviceBatch (and every DLPack export of it) is gone
// and, for each consumer stream named through WaitOn/export, after the work that stream had
// queued by then — the next copy into the slot waits for it on the device.
//
// Device-memory tier: when StagerOptions::device_tier fits this rank's share, epoch 1 also
// keeps every staged sample resident on the device; once resident() is true, AssembleResident
// builds batches from device memory by a gather kernel and no payload moves host → device.
//
// Without CUDA or without a GPU the same API runs on host memory (Backend::kHost): device
// pointers are host pointers, copies are memcpy, events are always complete.
//
// Thread safety: Start/Next/AssembleResident are called by one consumer thread at a time;
// DeviceBatch objects may be dropped on any thread. The source is only called by the worker.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <thread>
#include <vector>

#include <dlpack/dlpack.h>

#include "common/mutex.h"
#include "common/status.h"
#include "gpu/convert.h"
#include "gpu/device.h"
#include "gpu/device_tier.h"

namespace shardcache::gpu {

// A batch in host memory (usually an arena slot of the daemon's shared memory).
struct HostBatch {
  const void* data = nullptr;
  uint64_t bytes = 0;
  // Samples in the batch; with record_bytes > 0 sample i is bytes [i·record_bytes, (i+1)·record_bytes).
  uint64_t records = 0;
  // Fixed record size, or 0 for variable-size samples (then sample_offsets/lengths describe them).
  uint64_t record_bytes = 0;
  // Global sample ids, one per sample; needed by the device-memory tier, optional otherwise.
  std::vector<int64_t> sample_ids;
  // Variable-size samples only: where each sample starts in data and how long it is.
  std::vector<uint64_t> sample_offsets;
  std::vector<uint64_t> sample_lengths;
  // Gives the arena slot back. Called exactly once, after the bytes were copied, on the
  // stager's release thread (also when the stager stops before copying the batch).
  std::function<void()> release;
};

// Returns the next host batch, std::nullopt at the end of the epoch, or an error. May block.
using HostBatchSource = std::function<Result<std::optional<HostBatch>>()>;

struct StagerOptions {
  // Device buffers (batches staged ahead of the trainer). Default: 2.
  int depth = 2;
  // Largest host batch in bytes; sizes the device buffers. Required.
  uint64_t max_batch_bytes = 0;
  // Most samples in one batch (sizes converted outputs). Required when a conversion is set;
  // default: max_batch_bytes / record_bytes.
  uint64_t max_records = 0;
  // Record size of the dataset (0 = variable-size samples; only the kNone conversion then).
  uint64_t record_bytes = 0;
  // Fused conversion run after the copy. Default: none (raw bytes).
  ConversionSpec conversion;
  DeviceOptions device;
  // The shared-memory arena batches point into; registered once for the stager's lifetime.
  // nullptr: no registration, every batch goes through the bounce pool.
  void* arena = nullptr;
  uint64_t arena_bytes = 0;
  // The arena is mapped PROT_READ (libshardcache's is): register with cudaHostRegisterReadOnly.
  bool arena_read_only = false;
  // Use the bounce pool even when the arena could be registered (tests, benchmark baseline).
  bool force_bounce = false;
  // Device-memory tier: kept off unless budget_bytes covers share_bytes.
  DeviceTierOptions device_tier;
  uint64_t share_bytes = 0;    // this rank's bytes per epoch
  uint64_t share_samples = 0;  // this rank's samples per epoch
};

namespace stager_internal {
struct Slot;
struct Pool;
struct Lease;
}  // namespace stager_internal

struct DeviceTensor {
  void* data = nullptr;  // device memory (host memory on the host backend)
  DType dtype = DType::kUInt8;
  std::vector<int64_t> shape;
  uint64_t bytes() const;
};

// One staged batch in device memory. Move-only; its device buffer returns to the stager's pool
// when this object and all DLPack exports of it are gone.
class DeviceBatch {
 public:
  DeviceBatch() = default;
  ~DeviceBatch();
  DeviceBatch(DeviceBatch&&) noexcept;
  DeviceBatch& operator=(DeviceBatch&&) noexcept;

  // Tensors per the conversion: raw bytes; tokens (input[, target]); images.
  size_t num_tensors() const { return tensors_.size(); }
  const DeviceTensor& tensor(size_t i) const { return tensors_.at(i); }
  uint64_t records() const { return records_; }
  const std::vector<int64_t>& sample_ids() const { return sample_ids_; }
  // Raw layout only (kNone): where each sample starts in tensor(0).
  const std::vector<uint64_t>& sample_offsets() const { return sample_offsets_; }
  Backend backend() const;
  int device_ordinal() const;
  // Complete once the batch's bytes and conversion are in device memory.
  const Event& ready() const;

  // Makes `consumer` wait (on the device) for ready(), and remembers it: the buffer is reused
  // only after the work `consumer` has queued by the time this batch is dropped.
  // REQUIRES: consumer outlives this batch. No-op on the host backend.
  Status WaitOn(NativeStream consumer);

  // DLPack export of tensor(index), following the Python array API's __dlpack__(stream=):
  // stream -1: no synchronisation; 1: the legacy default stream; 2: the per-thread default
  // stream; otherwise a cudaStream_t given as an integer (Python passes None as 1). The
  // consumer stream waits on ready() as with WaitOn. Device type kDLCUDA, or kDLCPU on the
  // host backend. The returned tensor holds the batch's buffer until its deleter runs.
  Result<DLManagedTensor*> ExportDLPack(size_t index, int64_t stream);

 private:
  friend class Stager;
  std::shared_ptr<stager_internal::Lease> lease_;
  std::vector<DeviceTensor> tensors_;
  uint64_t records_ = 0;
  std::vector<int64_t> sample_ids_;
  std::vector<uint64_t> sample_offsets_;
};

// What one stager has done since Create. These are the stager's only counters: the trainer
// process renders no metrics, so it reads them here (Python: Stager.stats()).
struct StagerStats {
  uint64_t batches_staged = 0;    // copied from host batches
  uint64_t bytes_staged = 0;
  uint64_t bytes_bounced = 0;     // of bytes_staged, copied through the bounce pool
  uint64_t batches_gathered = 0;  // assembled from the device tier (AssembleResident)
  bool arena_registered = false;
  // Host-to-device bytes on the stager's stream: batch payload, and the device tier's gather
  // indexes (24 bytes per sample). Epochs served from the device tier add no payload bytes.
  uint64_t h2d_payload_bytes = 0;
  uint64_t h2d_index_bytes = 0;
};

class Stager {
 public:

  // Allocates the device pool, registers the arena and, when it fits, the device tier.
  static Result<std::unique_ptr<Stager>> Create(const StagerOptions& options);
  // Stops the worker, waits for copies in flight and releases every host batch it holds.
  ~Stager();
  Stager(const Stager&) = delete;
  Stager& operator=(const Stager&) = delete;

  // Starts staging one epoch from `source`. FailedPrecondition while an epoch is still running
  // (Next() has not yet returned its end).
  Status Start(HostBatchSource source);
  // The next staged batch in source order; std::nullopt at the end of the epoch; the source's
  // error, or a staging error, otherwise. Blocks only until the batch's copy was *enqueued*.
  Result<std::optional<DeviceBatch>> Next();

  // True when the device tier holds this rank's whole share.
  bool resident() const;
  bool has_device_tier() const { return tier_ != nullptr; }
  // Epoch ≥ 2 with the device tier: a batch of the given samples gathered from device memory.
  // FailedPrecondition before resident(); NotFound for an unknown sample.
  Result<DeviceBatch> AssembleResident(std::span<const int64_t> sample_ids);

  const Device& device() const { return device_; }
  StagerStats Stats() const;

 private:
  struct Ready;  // a staged batch waiting in the ready queue, or the epoch's end / error
  Stager(const StagerOptions& options, Device device);
  void WorkerLoop(HostBatchSource source);
  void ReleaseLoop();
  // Stages one host batch into a free slot; returns the ready entry. The steps below may leave
  // batch.release set on error; Stage hands it to the release thread then.
  Result<Ready> Stage(size_t slot, HostBatch batch);
  Status CheckBatch(const HostBatch& batch) const;
  // Waits for the slot's previous consumers, then copies the batch into the slot directly from
  // the registered arena or through the slot's bounce buffer; hands batch.release on once the
  // arena bytes are no longer needed.
  Status CopyIn(stager_internal::Slot& slot, HostBatch& batch);
  Status CopyDirect(stager_internal::Slot& slot, HostBatch& batch);
  Status CopyBounced(stager_internal::Slot& slot, HostBatch& batch);
  // Device-tier ingest (epoch 1), the conversion, and the slot's ready event.
  Status Process(stager_internal::Slot& slot, const HostBatch& batch);
  DeviceBatch MakeBatch(std::shared_ptr<stager_internal::Lease> lease, uint64_t records, uint64_t bytes,
                        std::vector<int64_t> ids, std::vector<uint64_t> offsets);
  void QueueRelease(std::function<void()> release);
  static void OnCopyDone(void* arg);
  void StopWorker();

  StagerOptions options_;  // constant after Create
  const Device device_;
  Converter converter_;
  Stream stream_;  // the stager's copy stream
  HostRegistration registration_;
  std::unique_ptr<DeviceTier> tier_;
  std::shared_ptr<stager_internal::Pool> pool_;

  // Ready queue: worker → Next().
  Mutex ready_mu_;
  CondVar ready_cv_;
  std::deque<Ready> ready_ GUARDED_BY(ready_mu_);
  bool epoch_running_ GUARDED_BY(ready_mu_) = false;

  // Release queue: copy-done callbacks → release thread.
  Mutex release_mu_;
  CondVar release_cv_;
  std::deque<std::function<void()>> releases_ GUARDED_BY(release_mu_);
  bool release_stop_ GUARDED_BY(release_mu_) = false;
  std::thread release_thread_;

  std::atomic<bool> stop_{false};
  std::thread worker_;

  std::atomic<uint64_t> batches_staged_{0}, bytes_staged_{0}, bytes_bounced_{0}, batches_gathered_{0};
};

}  // namespace shardcache::gpu
