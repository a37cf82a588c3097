// DeviceTier: keeps a dataset — or this rank's share of it — resident in GPU memory after the
// first epoch, and assembles later batches on the device with a gather kernel, so epochs ≥ 2
// move no payload bytes host → device.
//
// Epoch 1 streams batches through the stager as usual; each staged batch is also appended
// (device to device) to one resident buffer, sample by sample, until every sample of the share
// is resident (complete()). Later batches are gathered from it: the host sends only the
// batch's index (24 bytes per sample, counted in the stream's h2d_bytes().index).
// A tier is only created when the declared share fits the byte budget; otherwise the caller
// keeps staging from host memory every epoch.
//
//   resident buffer:  | sample a | sample b | ... |   (arrival order, no padding)
//   index (host):     sample id → (offset, bytes)
//
// Thread safety: all methods take an internal mutex; work is ordered on the caller's stream.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <unordered_map>
#include <vector>

#include "common/mutex.h"
#include "gpu/device.h"
#include "gpu/kernel_args.h"

namespace shardcache::gpu {

struct DeviceTierOptions {
  // GPU bytes the tier may keep resident; 0 turns the tier off. Default: 0.
  uint64_t budget_bytes = 0;
  // Gathers that may be in flight at once; each owns an index buffer. Default: 4.
  int index_slots = 4;
  // Samples one gather may carry (sizes the index buffers). Default: 65536.
  uint64_t max_samples_per_gather = 65536;
};

class DeviceTier {
 public:
  // share_bytes / share_samples: the total size and sample count of what this rank reads per
  // epoch. ResourceExhausted when share_bytes exceeds the budget (or the budget is 0);
  // InvalidArgument when the share is empty.
  static Result<std::unique_ptr<DeviceTier>> Create(const Device& device, const DeviceTierOptions& options,
                                                    uint64_t share_bytes, uint64_t share_samples);
  ~DeviceTier();

  // Copies the samples of a batch that is (or will be, in `stream` order) in device memory at
  // batch_device into the resident buffer: sample i is bytes [offsets[i], offsets[i] +
  // lengths[i]) of the batch. Samples already resident are skipped. Enqueued on `stream`.
  // ResourceExhausted when the samples exceed the declared share; InvalidArgument when the
  // spans differ in length.
  Status Ingest(const Stream& stream, const void* batch_device, std::span<const int64_t> sample_ids,
                std::span<const uint64_t> offsets, std::span<const uint64_t> lengths);

  // Assembles the samples, in the given order and back to back, into dst (device memory of
  // dst_capacity bytes), on `stream`. Returns the bytes written; *sample_offsets (optional)
  // receives where each sample starts. NotFound names a sample that is not resident;
  // ResourceExhausted when dst is too small or the batch exceeds max_samples_per_gather.
  Result<uint64_t> Gather(const Stream& stream, std::span<const int64_t> sample_ids, void* dst,
                          uint64_t dst_capacity, std::vector<uint64_t>* sample_offsets = nullptr);

  // True once every sample of the declared share is resident.
  bool complete() const;
  uint64_t resident_bytes() const;
  uint64_t resident_samples() const;

 private:
  struct IndexSlot {
    DeviceBuffer items_device;
    PinnedBuffer items_host;
    Event done;  // recorded after the gather that last used this slot
  };
  DeviceTier() = default;
  // Uploads items through the next index slot and runs the gather; mu_ held.
  Status RunGather(const Stream& stream, void* dst, const void* src, const std::vector<GatherItem>& items)
      REQUIRES(mu_);

  Device device_ = Device::Host();
  DeviceTierOptions options_;
  uint64_t share_bytes_ = 0;
  uint64_t share_samples_ = 0;
  DeviceBuffer resident_;

  mutable Mutex mu_;
  uint64_t used_bytes_ GUARDED_BY(mu_) = 0;
  std::unordered_map<int64_t, std::pair<uint64_t, uint64_t>> index_ GUARDED_BY(mu_);
  std::vector<IndexSlot> index_slots_ GUARDED_BY(mu_);
  size_t next_index_slot_ GUARDED_BY(mu_) = 0;
};

}  // namespace shardcache::gpu
