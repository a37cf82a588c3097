#include "gpu/stager.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include <spdlog/spdlog.h>

#include "common/log.h"
#include "common/units.h"

namespace shardcache::gpu {

namespace stager_internal {

// Consumer streams whose work a slot can wait for on the device; beyond this many distinct
// streams per batch the stager synchronises the extra ones on the host when the batch is
// dropped. Events are created up front so dropping a batch never creates CUDA objects (or
// changes the current device) on the trainer's thread.
constexpr size_t kMaxConsumerStreams = 4;

struct Slot {
  DeviceBuffer raw;                    // the batch as copied
  std::vector<DeviceBuffer> outputs;   // converted tensors (empty for the raw layout)
  PinnedBuffer bounce;                 // allocated on first use of the bounce path
  Event ready;                         // copy + conversion done
  std::vector<Event> consumer_events;  // kMaxConsumerStreams, recorded when a lease ends
  size_t consumer_events_pending = 0;       // recorded ones the next use must wait for
};

// The device buffers, shared by the stager and every live batch or DLPack export, so either
// may go first. Lock order: Lease::mu before Pool::mu.
struct Pool {
  explicit Pool(Device d) : device(d) {}
  const Device device;
  std::vector<Slot> slots;  // fixed after creation; a slot's contents belong to its holder

  Mutex mu;
  CondVar cv;
  std::vector<size_t> free GUARDED_BY(mu);
  bool stopping GUARDED_BY(mu) = false;

  // Blocks for a free slot; std::nullopt once the stager stops.
  std::optional<size_t> Acquire() {
    MutexLock lock(&mu);
    cv.Wait(&mu, [&]() REQUIRES(mu) { return stopping || !free.empty(); });
    if (stopping) return std::nullopt;
    size_t s = free.back();
    free.pop_back();
    return s;
  }

  void Return(size_t s, const std::vector<NativeStream>& consumers) {
    Slot& slot = slots[s];
    size_t n = 0;
    for (NativeStream consumer : consumers) {
      Status st = n < slot.consumer_events.size() ? slot.consumer_events[n].RecordOn(consumer)
                                                  : StreamSynchronize(consumer);
      if (!st.ok()) {
        spdlog::error("stager: ordering slot reuse after a consumer stream failed: {}", st.ToString());
      } else if (n < slot.consumer_events.size()) {
        ++n;
      }
    }
    slot.consumer_events_pending = n;
    {
      MutexLock lock(&mu);
      free.push_back(s);
    }
    cv.NotifyOne();
  }

  void Stop() {
    {
      MutexLock lock(&mu);
      stopping = true;
    }
    cv.NotifyAll();
  }
};

// Holds one slot for one DeviceBatch (and its DLPack exports).
struct Lease {
  Lease(std::shared_ptr<Pool> p, size_t s) : pool(std::move(p)), slot(s) {}
  ~Lease() { pool->Return(slot, consumers); }
  Lease(const Lease&) = delete;
  Lease& operator=(const Lease&) = delete;

  std::shared_ptr<Pool> pool;
  const size_t slot;
  Mutex mu;
  std::vector<NativeStream> consumers GUARDED_BY(mu);
};

}  // namespace stager_internal

using stager_internal::Lease;
using stager_internal::Pool;
using stager_internal::Slot;

namespace {

struct ReleaseCall {
  Stager* stager;
  std::function<void()> fn;
};

}  // namespace

// A staged batch (lease set), the end of the epoch (end), or an error.
struct Stager::Ready {
  std::shared_ptr<Lease> lease;
  uint64_t records = 0;
  uint64_t bytes = 0;
  std::vector<int64_t> ids;
  std::vector<uint64_t> offsets;
  bool end = false;
  Status error;
};

uint64_t DeviceTensor::bytes() const {
  uint64_t n = DTypeBytes(dtype);
  for (int64_t d : shape) n *= static_cast<uint64_t>(d);
  return n;
}

// ---- DeviceBatch -------------------------------------------------------------------------

DeviceBatch::~DeviceBatch() = default;
DeviceBatch::DeviceBatch(DeviceBatch&&) noexcept = default;
DeviceBatch& DeviceBatch::operator=(DeviceBatch&&) noexcept = default;

Backend DeviceBatch::backend() const { return lease_->pool->device.backend(); }
int DeviceBatch::device_ordinal() const { return lease_->pool->device.ordinal(); }
const Event& DeviceBatch::ready() const { return lease_->pool->slots[lease_->slot].ready; }

Status DeviceBatch::WaitOn(NativeStream consumer) {
  if (!lease_) return FailedPrecondition("DeviceBatch::WaitOn on an empty batch");
  if (!lease_->pool->device.is_cuda()) return Status::Ok();
  SC_RETURN_IF_ERROR(StreamWaitEvent(consumer, ready()));
  MutexLock lock(&lease_->mu);
  if (std::find(lease_->consumers.begin(), lease_->consumers.end(), consumer) == lease_->consumers.end()) {
    lease_->consumers.push_back(consumer);
  }
  return Status::Ok();
}

namespace {
struct DLPackContext {
  std::shared_ptr<Lease> lease;
  std::vector<int64_t> shape;
  DLManagedTensor managed{};
};

void DeleteDLPack(DLManagedTensor* t) { delete static_cast<DLPackContext*>(t->manager_ctx); }
}  // namespace

Result<DLManagedTensor*> DeviceBatch::ExportDLPack(size_t index, int64_t stream) {
  if (!lease_) return FailedPrecondition("DLPack export of an empty batch");
  if (index >= tensors_.size()) {
    return OutOfRange("DLPack export: tensor " + std::to_string(index) + " of a batch with " +
                      std::to_string(tensors_.size()));
  }
  const bool cuda = lease_->pool->device.is_cuda();
  if (cuda && stream == 0) {
    return InvalidArgument("DLPack export: stream 0 is ambiguous for CUDA; pass 1 (legacy default) or 2 (per-thread)");
  }
  if (cuda && stream != -1) SC_RETURN_IF_ERROR(WaitOn(reinterpret_cast<NativeStream>(stream)));
  auto ctx = std::make_unique<DLPackContext>();
  const DeviceTensor& t = tensors_[index];
  ctx->lease = lease_;
  ctx->shape = t.shape;
  DLTensor& dl = ctx->managed.dl_tensor;
  dl.data = t.data;
  dl.device = cuda ? DLDevice{kDLCUDA, lease_->pool->device.ordinal()} : DLDevice{kDLCPU, 0};
  dl.ndim = static_cast<int32_t>(ctx->shape.size());
  dl.dtype = ToDLDataType(t.dtype);
  dl.shape = ctx->shape.data();
  dl.strides = nullptr;
  dl.byte_offset = 0;
  ctx->managed.manager_ctx = ctx.get();
  ctx->managed.deleter = DeleteDLPack;
  return &ctx.release()->managed;
}

// ---- Stager ------------------------------------------------------------------------------

Stager::Stager(const StagerOptions& options, Device device) : options_(options), device_(device) {}

Result<std::unique_ptr<Stager>> Stager::Create(const StagerOptions& options) {
  if (options.depth < 1) return InvalidArgument("stager: depth must be >= 1, got " + std::to_string(options.depth));
  if (options.max_batch_bytes == 0) return InvalidArgument("stager: max_batch_bytes is required");
  if ((options.arena == nullptr) != (options.arena_bytes == 0)) {
    return InvalidArgument("stager: arena and arena_bytes must be given together");
  }
  SC_ASSIGN_OR_RETURN(Device device, Device::Open(options.device));
  std::unique_ptr<Stager> s(new Stager(options, device));
  SC_ASSIGN_OR_RETURN(s->converter_, Converter::Create(options.conversion, options.record_bytes));
  uint64_t max_records = options.max_records;
  if (max_records == 0 && options.record_bytes > 0) max_records = options.max_batch_bytes / options.record_bytes;
  if (!s->converter_.identity() && max_records == 0) {
    return InvalidArgument("stager: max_records is required with a conversion");
  }
  s->options_.max_records = max_records;
  SC_ASSIGN_OR_RETURN(s->stream_, Stream::Create(device));

  auto pool = std::make_shared<Pool>(device);
  for (int i = 0; i < options.depth; ++i) {
    Slot slot;
    SC_ASSIGN_OR_RETURN(slot.raw, DeviceBuffer::Allocate(device, options.max_batch_bytes));
    if (!s->converter_.identity()) {
      for (const TensorDesc& d : s->converter_.Outputs(max_records, options.max_batch_bytes)) {
        SC_ASSIGN_OR_RETURN(DeviceBuffer out, DeviceBuffer::Allocate(device, d.bytes()));
        slot.outputs.push_back(std::move(out));
      }
    }
    SC_ASSIGN_OR_RETURN(slot.ready, Event::Create(device));
    for (size_t k = 0; k < stager_internal::kMaxConsumerStreams; ++k) {
      SC_ASSIGN_OR_RETURN(Event e, Event::Create(device));
      slot.consumer_events.push_back(std::move(e));
    }
    pool->slots.push_back(std::move(slot));
    MutexLock lock(&pool->mu);  // not shared yet: for the analysis
    pool->free.push_back(static_cast<size_t>(options.depth - 1 - i));
  }
  s->pool_ = std::move(pool);

  if (options.arena != nullptr && !options.force_bounce) {
    auto reg = HostRegistration::Register(device, options.arena, options.arena_bytes,
                                                  options.arena_read_only);
    if (reg.ok()) {
      s->registration_ = std::move(*reg);
    } else {
      spdlog::warn("stager: registering the {} arena failed ({}); copying through a pinned bounce pool instead",
                   FormatBytes(options.arena_bytes), reg.status().ToString());
    }
  } else if (options.force_bounce) {
    spdlog::info("stager: bounce pool forced; the arena is not registered");
  }

  if (options.device_tier.budget_bytes > 0) {
    auto tier = DeviceTier::Create(device, options.device_tier, options.share_bytes, options.share_samples);
    if (tier.ok()) {
      s->tier_ = std::move(*tier);
    } else if (tier.status().code() == StatusCode::kResourceExhausted) {
      spdlog::info("stager: no device-memory tier: {}", tier.status().message());
    } else {
      return tier.status();
    }
  }

  s->release_thread_ = std::thread([p = s.get()] { p->ReleaseLoop(); });
  spdlog::info("stager: {} on {}, depth {}, {} per slot, arena {}", options.conversion.kind ==
               ConversionSpec::Kind::kNone ? "raw" : "converting", device.Describe(), options.depth,
               FormatBytes(options.max_batch_bytes), s->registration_.registered() ? "registered" : "bounced");
  return s;
}

Stager::~Stager() {
  StopWorker();
  // Copy-done callbacks still queued on the stream must run while this object exists.
  Status st = stream_.Synchronize();
  if (!st.ok()) spdlog::error("stager: synchronising the copy stream at shutdown: {}", st.ToString());
  {
    MutexLock lock(&ready_mu_);
    ready_.clear();
  }
  {
    MutexLock lock(&release_mu_);
    release_stop_ = true;
  }
  release_cv_.NotifyAll();
  if (release_thread_.joinable()) release_thread_.join();
}

void Stager::StopWorker() {
  stop_.store(true);
  if (pool_) pool_->Stop();  // null when Create failed part way
  // The worker may be inside the source; it returns once the source does.
  if (worker_.joinable()) worker_.join();
}

Status Stager::Start(HostBatchSource source) {
  MutexLock lock(&ready_mu_);
  if (epoch_running_) return FailedPrecondition("stager: an epoch is still being staged; drain Next() first");
  if (stop_.load()) return FailedPrecondition("stager: stopped");
  if (worker_.joinable()) worker_.join();  // the previous epoch's worker has pushed its end
  ready_.clear();
  epoch_running_ = true;
  worker_ = std::thread([this, src = std::move(source)]() mutable { WorkerLoop(std::move(src)); });
  return Status::Ok();
}

void Stager::WorkerLoop(HostBatchSource source) {
  Ready last;
  last.end = true;
  Status st = device_.MakeCurrent();
  while (st.ok()) {
    std::optional<size_t> slot = pool_->Acquire();
    if (!slot) {
      st = Cancelled("stager stopped");
      break;
    }
    auto lease = std::make_shared<Lease>(pool_, *slot);
    Result<std::optional<HostBatch>> next = source();
    if (!next.ok()) {
      st = next.status().WithContext("stager source");
      break;
    }
    if (!next->has_value()) break;  // end of epoch
    Result<Ready> ready = Stage(*slot, std::move(**next));
    if (!ready.ok()) {
      st = ready.status();
      break;
    }
    ready->lease = std::move(lease);
    {
      MutexLock lock(&ready_mu_);
      ready_.push_back(std::move(*ready));
    }
    ready_cv_.NotifyOne();
  }
  if (!st.ok()) {
    last.end = false;
    last.error = st;
  }
  {
    MutexLock lock(&ready_mu_);
    ready_.push_back(std::move(last));
  }
  ready_cv_.NotifyOne();
}

Result<Stager::Ready> Stager::Stage(size_t slot_index, HostBatch batch) {
  Slot& slot = pool_->slots[slot_index];
  Status st = CheckBatch(batch);
  if (st.ok()) st = CopyIn(slot, batch);
  if (st.ok()) st = Process(slot, batch);
  if (!st.ok()) {
    // Every path out of here hands batch.release to the release thread exactly once: the copy
    // has handed it on already, or it goes now.
    if (batch.release) QueueRelease(std::move(batch.release));
    return st;
  }
  Ready ready;
  ready.records = batch.records;
  ready.bytes = batch.bytes;
  if (batch.record_bytes == 0) ready.offsets = batch.sample_offsets;
  ready.ids = std::move(batch.sample_ids);
  batches_staged_ += 1;
  bytes_staged_ += batch.bytes;
  return ready;
}

Status Stager::CheckBatch(const HostBatch& batch) const {
  const uint64_t rb = batch.record_bytes;
  if (batch.data == nullptr && batch.bytes > 0) return InvalidArgument("stager: host batch without data");
  if (batch.bytes > options_.max_batch_bytes) {
    return InvalidArgument("stager: batch of " + std::to_string(batch.bytes) + " bytes exceeds max_batch_bytes " +
                           std::to_string(options_.max_batch_bytes));
  }
  if (rb != options_.record_bytes) {
    return InvalidArgument("stager: batch record_bytes " + std::to_string(rb) + " != the stager's " +
                           std::to_string(options_.record_bytes));
  }
  if (rb > 0 && batch.bytes != batch.records * rb) {
    return InvalidArgument("stager: batch of " + std::to_string(batch.records) + " records of " +
                           std::to_string(rb) + " bytes holds " + std::to_string(batch.bytes) + " bytes");
  }
  if (options_.max_records > 0 && batch.records > options_.max_records) {
    return InvalidArgument("stager: batch of " + std::to_string(batch.records) + " records exceeds max_records " +
                           std::to_string(options_.max_records));
  }
  if (!batch.sample_ids.empty() && batch.sample_ids.size() != batch.records) {
    return InvalidArgument("stager: " + std::to_string(batch.sample_ids.size()) + " sample ids for " +
                           std::to_string(batch.records) + " records");
  }
  if (rb == 0 && (batch.sample_offsets.size() != batch.records || batch.sample_lengths.size() != batch.records)) {
    return InvalidArgument("stager: variable-size batch needs one offset and length per sample");
  }
  return Status::Ok();
}

Status Stager::CopyIn(Slot& slot, HostBatch& batch) {
  // The slot's previous consumers must be done with it before it is overwritten.
  for (size_t i = 0; i < slot.consumer_events_pending; ++i) SC_RETURN_IF_ERROR(stream_.WaitEvent(slot.consumer_events[i]));
  slot.consumer_events_pending = 0;
  if (registration_.registered() && registration_.Contains(batch.data, batch.bytes)) return CopyDirect(slot, batch);
  return CopyBounced(slot, batch);
}

Status Stager::CopyDirect(Slot& slot, HostBatch& batch) {
  SC_RETURN_IF_ERROR(CopyAsync(stream_, slot.raw.data(), batch.data, batch.bytes, CopyKind::kHostToDevice));
  if (!batch.release) return Status::Ok();
  // Release the arena slot when the copy has run; the callback only queues (no CUDA, no
  // socket I/O on the runtime's callback thread).
  auto* call = new ReleaseCall{this, std::move(batch.release)};
  Status hs = stream_.LaunchHostFunc(&Stager::OnCopyDone, call);
  if (!hs.ok()) {
    batch.release = std::move(call->fn);
    delete call;
    (void)stream_.Synchronize();  // the copy must be finished before the slot goes back
  }
  return hs;
}

Status Stager::CopyBounced(Slot& slot, HostBatch& batch) {
  if (options_.arena != nullptr && !options_.force_bounce && registration_.registered()) {
    SC_LOG_RATE_LIMITED(spdlog::level::warn, "stager: batch at {} lies outside the registered arena; bouncing",
                        batch.data);
  }
  if (slot.bounce.data() == nullptr) {
    SC_ASSIGN_OR_RETURN(slot.bounce, PinnedBuffer::Allocate(device_, options_.max_batch_bytes));
  }
  // The previous H2D copy out of this bounce buffer must be finished before it is rewritten.
  SC_RETURN_IF_ERROR(slot.ready.Synchronize());
  std::memcpy(slot.bounce.data(), batch.data, batch.bytes);
  // The arena bytes are in the bounce buffer: the arena slot may go back now.
  if (batch.release) QueueRelease(std::move(batch.release));
  SC_RETURN_IF_ERROR(
      CopyAsync(stream_, slot.raw.data(), slot.bounce.data(), batch.bytes, CopyKind::kHostToDevice));
  bytes_bounced_ += batch.bytes;
  return Status::Ok();
}

Status Stager::Process(Slot& slot, const HostBatch& batch) {
  const uint64_t rb = batch.record_bytes;
  if (tier_ != nullptr && !batch.sample_ids.empty() && !tier_->complete()) {
    std::vector<uint64_t> offsets = batch.sample_offsets, lengths = batch.sample_lengths;
    if (rb > 0) {
      offsets.resize(batch.records);
      lengths.assign(batch.records, rb);
      for (uint64_t i = 0; i < batch.records; ++i) offsets[i] = i * rb;
    }
    SC_RETURN_IF_ERROR(tier_->Ingest(stream_, slot.raw.data(), batch.sample_ids, offsets, lengths));
  }
  if (!converter_.identity()) {
    std::vector<void*> outs;
    for (auto& o : slot.outputs) outs.push_back(o.data());
    SC_RETURN_IF_ERROR(converter_.Run(stream_, slot.raw.data(), batch.records, outs));
  }
  return slot.ready.Record(stream_);
}

void Stager::OnCopyDone(void* arg) {
  std::unique_ptr<ReleaseCall> call(static_cast<ReleaseCall*>(arg));
  call->stager->QueueRelease(std::move(call->fn));
}

void Stager::QueueRelease(std::function<void()> release) {
  {
    MutexLock lock(&release_mu_);
    releases_.push_back(std::move(release));
  }
  release_cv_.NotifyOne();
}

void Stager::ReleaseLoop() {
  MutexLock lock(&release_mu_);
  for (;;) {
    release_cv_.Wait(&release_mu_, [&]() REQUIRES(release_mu_) { return release_stop_ || !releases_.empty(); });
    if (releases_.empty()) return;  // stopping and drained
    std::function<void()> fn = std::move(releases_.front());
    releases_.pop_front();
    lock.Unlock();
    if (fn) fn();
    lock.Lock();
  }
}

DeviceBatch Stager::MakeBatch(std::shared_ptr<Lease> lease, uint64_t records, uint64_t bytes,
                              std::vector<int64_t> ids, std::vector<uint64_t> offsets) {
  DeviceBatch b;
  Slot& slot = pool_->slots[lease->slot];
  std::vector<TensorDesc> descs = converter_.Outputs(records, bytes);
  for (size_t i = 0; i < descs.size(); ++i) {
    void* data = converter_.identity() ? slot.raw.data() : slot.outputs[i].data();
    b.tensors_.push_back(DeviceTensor{data, descs[i].dtype, descs[i].shape});
  }
  b.lease_ = std::move(lease);
  b.records_ = records;
  b.sample_ids_ = std::move(ids);
  b.sample_offsets_ = std::move(offsets);
  return b;
}

Result<std::optional<DeviceBatch>> Stager::Next() {
  Ready r;
  {
    MutexLock lock(&ready_mu_);
    if (!epoch_running_) return FailedPrecondition("stager: Next() without a running epoch; call Start()");
    ready_cv_.Wait(&ready_mu_, [&]() REQUIRES(ready_mu_) { return !ready_.empty(); });
    r = std::move(ready_.front());
    ready_.pop_front();
    if (r.end || !r.error.ok()) epoch_running_ = false;
  }
  if (!r.error.ok()) return r.error;
  if (r.end) return std::optional<DeviceBatch>();
  return std::optional<DeviceBatch>(
      MakeBatch(std::move(r.lease), r.records, r.bytes, std::move(r.ids), std::move(r.offsets)));
}

bool Stager::resident() const { return tier_ != nullptr && tier_->complete(); }

Result<DeviceBatch> Stager::AssembleResident(std::span<const int64_t> sample_ids) {
  if (tier_ == nullptr) return FailedPrecondition("stager: no device-memory tier (off, or the share does not fit)");
  if (!tier_->complete()) {
    return FailedPrecondition("stager: device tier holds " + std::to_string(tier_->resident_samples()) + " of " +
                              std::to_string(options_.share_samples) + " samples; finish epoch 1 first");
  }
  if (options_.max_records > 0 && sample_ids.size() > options_.max_records) {
    return InvalidArgument("stager: " + std::to_string(sample_ids.size()) + " samples exceed max_records " +
                           std::to_string(options_.max_records));
  }
  SC_RETURN_IF_ERROR(device_.MakeCurrent());
  std::optional<size_t> slot_index = pool_->Acquire();
  if (!slot_index) return Cancelled("stager stopped");
  auto lease = std::make_shared<Lease>(pool_, *slot_index);
  Slot& slot = pool_->slots[*slot_index];
  for (size_t i = 0; i < slot.consumer_events_pending; ++i) SC_RETURN_IF_ERROR(stream_.WaitEvent(slot.consumer_events[i]));
  slot.consumer_events_pending = 0;
  std::vector<uint64_t> offsets;
  SC_ASSIGN_OR_RETURN(uint64_t bytes,
                      tier_->Gather(stream_, sample_ids, slot.raw.data(), options_.max_batch_bytes, &offsets));
  if (!converter_.identity()) {
    std::vector<void*> outs;
    for (auto& o : slot.outputs) outs.push_back(o.data());
    SC_RETURN_IF_ERROR(converter_.Run(stream_, slot.raw.data(), sample_ids.size(), outs));
  }
  SC_RETURN_IF_ERROR(slot.ready.Record(stream_));
  batches_gathered_ += 1;
  if (options_.record_bytes > 0) offsets.clear();
  return MakeBatch(std::move(lease), sample_ids.size(), bytes,
                   std::vector<int64_t>(sample_ids.begin(), sample_ids.end()), std::move(offsets));
}

StagerStats Stager::Stats() const {
  StagerStats s;
  s.batches_staged = batches_staged_.load();
  s.bytes_staged = bytes_staged_.load();
  s.bytes_bounced = bytes_bounced_.load();
  s.batches_gathered = batches_gathered_.load();
  s.arena_registered = registration_.registered();
  const H2DBytes h2d = stream_.h2d_bytes();
  s.h2d_payload_bytes = h2d.payload;
  s.h2d_index_bytes = h2d.index;
  return s;
}

}  // namespace shardcache::gpu
