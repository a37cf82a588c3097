#include "gpu/device_tier.h"

#include <algorithm>
#include <cstring>

#include <spdlog/spdlog.h>

#include "common/units.h"
#include "gpu/reference.h"

#if SHARDCACHE_HAVE_CUDA
#include "gpu/cuda_status.h"
#include "gpu/kernels.h"
#endif

namespace shardcache::gpu {

Result<std::unique_ptr<DeviceTier>> DeviceTier::Create(const Device& device, const DeviceTierOptions& options,
                                                       uint64_t share_bytes, uint64_t share_samples) {
  if (share_bytes == 0 || share_samples == 0) return InvalidArgument("device tier: the share is empty");
  if (options.index_slots < 1) return InvalidArgument("device tier: index_slots must be >= 1");
  if (options.max_samples_per_gather == 0) return InvalidArgument("device tier: max_samples_per_gather must be >= 1");
  if (share_bytes > options.budget_bytes) {
    return ResourceExhausted("device tier: share of " + FormatBytes(share_bytes) + " does not fit the budget of " +
                             FormatBytes(options.budget_bytes));
  }
  std::unique_ptr<DeviceTier> tier(new DeviceTier());
  tier->device_ = device;
  tier->options_ = options;
  tier->share_bytes_ = share_bytes;
  tier->share_samples_ = share_samples;
  SC_ASSIGN_OR_RETURN(tier->resident_, DeviceBuffer::Allocate(device, share_bytes));
  const uint64_t index_bytes = options.max_samples_per_gather * sizeof(GatherItem);
  MutexLock lock(&tier->mu_);  // not shared yet: for the analysis
  for (int i = 0; i < options.index_slots; ++i) {
    IndexSlot slot;
    SC_ASSIGN_OR_RETURN(slot.items_device, DeviceBuffer::Allocate(device, index_bytes));
    SC_ASSIGN_OR_RETURN(slot.items_host, PinnedBuffer::Allocate(device, index_bytes));
    SC_ASSIGN_OR_RETURN(slot.done, Event::Create(device));
    tier->index_slots_.push_back(std::move(slot));
  }
  tier->index_.reserve(share_samples);
  spdlog::info("device tier: {} resident budget on {}, share {} in {} samples", FormatBytes(options.budget_bytes),
               device.Describe(), FormatBytes(share_bytes), share_samples);
  return tier;
}

DeviceTier::~DeviceTier() {
  // The index slots' pinned memory must not be freed while a gather still reads it.
  for (auto& slot : index_slots_) (void)slot.done.Synchronize();
}

Status DeviceTier::RunGather(const Stream& stream, void* dst, const void* src, const std::vector<GatherItem>& items) {
  if (items.empty()) return Status::Ok();
  if (items.size() > options_.max_samples_per_gather) {
    return ResourceExhausted("device tier: " + std::to_string(items.size()) + " samples in one batch exceed " +
                             "max_samples_per_gather " + std::to_string(options_.max_samples_per_gather));
  }
  IndexSlot& slot = index_slots_[next_index_slot_];
  next_index_slot_ = (next_index_slot_ + 1) % index_slots_.size();
  // The slot's host array may still be feeding its previous upload; with several slots this
  // wait is for a gather long finished.
  SC_RETURN_IF_ERROR(slot.done.Synchronize());
  const size_t bytes = items.size() * sizeof(GatherItem);
  std::memcpy(slot.items_host.data(), items.data(), bytes);
#if SHARDCACHE_HAVE_CUDA
  if (stream.native() != nullptr) {
    SC_RETURN_IF_ERROR(CopyAsync(stream, slot.items_device.data(), slot.items_host.data(), bytes,
                                 CopyKind::kHostToDevice, H2DClass::kIndex));
    int err = kernels::LaunchGather(dst, src, static_cast<const GatherItem*>(slot.items_device.data()),
                                    static_cast<int64_t>(items.size()), stream.native());
    if (err != 0) return CudaStatus(static_cast<cudaError_t>(err), "gather kernel launch");
    return slot.done.Record(stream);
  }
#endif
  // Host path: the same upload is charged to the index counter so the accounting matches.
  SC_RETURN_IF_ERROR(CopyAsync(stream, slot.items_device.data(), slot.items_host.data(), bytes,
                               CopyKind::kHostToDevice, H2DClass::kIndex));
  GatherReference(dst, src, static_cast<const GatherItem*>(slot.items_device.data()),
                  static_cast<int64_t>(items.size()));
  return slot.done.Record(stream);
}

Status DeviceTier::Ingest(const Stream& stream, const void* batch_device, std::span<const int64_t> sample_ids,
                          std::span<const uint64_t> offsets, std::span<const uint64_t> lengths) {
  if (sample_ids.size() != offsets.size() || sample_ids.size() != lengths.size()) {
    return InvalidArgument("device tier ingest: " + std::to_string(sample_ids.size()) + " ids but " +
                           std::to_string(offsets.size()) + " offsets and " + std::to_string(lengths.size()) +
                           " lengths");
  }
  MutexLock lock(&mu_);
  std::vector<GatherItem> items;
  std::vector<int64_t> item_ids;
  items.reserve(sample_ids.size());
  item_ids.reserve(sample_ids.size());
  std::unordered_map<int64_t, bool> in_batch;
  uint64_t used = used_bytes_;
  for (size_t i = 0; i < sample_ids.size(); ++i) {
    if (index_.count(sample_ids[i]) != 0 || !in_batch.emplace(sample_ids[i], true).second) continue;
    if (used + lengths[i] > share_bytes_ || index_.size() + items.size() + 1 > share_samples_) {
      return ResourceExhausted("device tier ingest: sample " + std::to_string(sample_ids[i]) +
                               " goes beyond the declared share (" + FormatBytes(share_bytes_) + ", " +
                               std::to_string(share_samples_) + " samples)");
    }
    items.push_back(GatherItem{offsets[i], used, lengths[i]});
    item_ids.push_back(sample_ids[i]);
    used += lengths[i];
  }
  // Ingest in pieces no larger than one index buffer.
  for (size_t begin = 0; begin < items.size(); begin += options_.max_samples_per_gather) {
    size_t end = std::min<size_t>(items.size(), begin + options_.max_samples_per_gather);
    std::vector<GatherItem> part(items.begin() + begin, items.begin() + end);
    SC_RETURN_IF_ERROR(RunGather(stream, resident_.data(), batch_device, part));
  }
  // Published once the copies are enqueued: a later Gather on the same stream is ordered after
  // them; one on another stream must first wait on an event recorded on this stream.
  for (size_t k = 0; k < items.size(); ++k) {
    index_.emplace(item_ids[k], std::make_pair(items[k].dst_offset, items[k].bytes));
  }
  used_bytes_ = used;
  return Status::Ok();
}

Result<uint64_t> DeviceTier::Gather(const Stream& stream, std::span<const int64_t> sample_ids, void* dst,
                                    uint64_t dst_capacity, std::vector<uint64_t>* sample_offsets) {
  MutexLock lock(&mu_);
  std::vector<GatherItem> items;
  items.reserve(sample_ids.size());
  if (sample_offsets != nullptr) sample_offsets->clear();
  uint64_t out = 0;
  for (int64_t id : sample_ids) {
    auto it = index_.find(id);
    if (it == index_.end()) return NotFound("device tier: sample " + std::to_string(id) + " is not resident");
    if (out + it->second.second > dst_capacity) {
      return ResourceExhausted("device tier: batch of " + std::to_string(sample_ids.size()) +
                               " samples exceeds the destination of " + FormatBytes(dst_capacity));
    }
    items.push_back(GatherItem{it->second.first, out, it->second.second});
    if (sample_offsets != nullptr) sample_offsets->push_back(out);
    out += it->second.second;
  }
  SC_RETURN_IF_ERROR(RunGather(stream, dst, resident_.data(), items));
  return out;
}

bool DeviceTier::complete() const {
  MutexLock lock(&mu_);
  return index_.size() == share_samples_;
}

uint64_t DeviceTier::resident_bytes() const {
  MutexLock lock(&mu_);
  return used_bytes_;
}

uint64_t DeviceTier::resident_samples() const {
  MutexLock lock(&mu_);
  return index_.size();
}

}  // namespace shardcache::gpu
