#include "gpu/device.h"

#include <cstdlib>
#include <cstring>
#include <new>
#include <utility>

#include <spdlog/spdlog.h>

#if SHARDCACHE_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "gpu/cuda_status.h"
#endif

namespace shardcache::gpu {

namespace {
// Host "device" allocations are aligned like cudaMalloc's (256 B) so vectorised code written
// against device alignment holds on host too.
constexpr size_t kHostAlignmentBytes = 256;

void* HostAlloc(size_t bytes) {
  size_t rounded = (bytes + kHostAlignmentBytes - 1) / kHostAlignmentBytes * kHostAlignmentBytes;
  return std::aligned_alloc(kHostAlignmentBytes, rounded == 0 ? kHostAlignmentBytes : rounded);
}
}  // namespace

const char* BackendName(Backend backend) { return backend == Backend::kCuda ? "cuda" : "host"; }

bool CudaCompiledIn() { return SHARDCACHE_HAVE_CUDA != 0; }

int VisibleCudaDevices() {
#if SHARDCACHE_HAVE_CUDA
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();  // not sticky; clear it so later calls do not report it
    return 0;
  }
  return count;
#else
  return 0;
#endif
}

#if SHARDCACHE_HAVE_CUDA
Status CudaStatus(cudaError_t err, std::string_view what) {
  std::string msg = std::string(what) + ": " + cudaGetErrorName(err) + ": " + cudaGetErrorString(err);
  switch (err) {
    case cudaSuccess:
      return Status::Ok();
    case cudaErrorMemoryAllocation:
      return ResourceExhausted(std::move(msg));
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorDevicesUnavailable:
    case cudaErrorNotReady:
      return Unavailable(std::move(msg));
    case cudaErrorInvalidValue:
    case cudaErrorInvalidDevice:
    case cudaErrorInvalidDevicePointer:
      return InvalidArgument(std::move(msg));
    case cudaErrorHostMemoryAlreadyRegistered:
      return AlreadyExists(std::move(msg));
    default:
      return Internal(std::move(msg));
  }
}
#endif

// ---- Device ------------------------------------------------------------------------------

Result<Device> Device::Open(const DeviceOptions& options) {
  using Select = DeviceOptions::Select;
  if (options.select == Select::kHost) return Device::Host();
  int count = VisibleCudaDevices();
  if (count == 0) {
    if (options.select == Select::kCuda) {
      return Unavailable(CudaCompiledIn() ? "no CUDA device visible to the runtime"
                                          : "shardcache was built without CUDA (nvcc not found)");
    }
    return Device::Host();
  }
  if (options.ordinal < 0 || options.ordinal >= count) {
    return InvalidArgument("CUDA device ordinal " + std::to_string(options.ordinal) +
                           " out of range: " + std::to_string(count) + " device(s) visible");
  }
  Device device(Backend::kCuda, options.ordinal);
  SC_RETURN_IF_ERROR(device.MakeCurrent());
  return device;
}

Status Device::MakeCurrent() const {
#if SHARDCACHE_HAVE_CUDA
  if (is_cuda()) SC_CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal_), "cudaSetDevice");
#endif
  return Status::Ok();
}

std::string Device::Describe() const {
#if SHARDCACHE_HAVE_CUDA
  if (is_cuda()) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, ordinal_) == cudaSuccess) {
      return "cuda:" + std::to_string(ordinal_) + " (" + prop.name + ", sm_" +
             std::to_string(prop.major) + std::to_string(prop.minor) + ")";
    }
    return "cuda:" + std::to_string(ordinal_);
  }
#endif
  return "host";
}

// ---- Stream ------------------------------------------------------------------------------

Result<Stream> Stream::Create(const Device& device) {
  Stream s;
  s.device_ = device;
#if SHARDCACHE_HAVE_CUDA
  if (device.is_cuda()) {
    SC_RETURN_IF_ERROR(device.MakeCurrent());
    cudaStream_t stream = nullptr;
    SC_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking),
                            "cudaStreamCreateWithFlags");
    s.stream_ = stream;
  }
#endif
  return s;
}

Stream::~Stream() {
#if SHARDCACHE_HAVE_CUDA
  if (stream_ != nullptr) {
    // Destroying a stream with pending work is allowed; the runtime finishes the work first.
    cudaError_t err = cudaStreamDestroy(stream_);
    if (err != cudaSuccess) spdlog::warn("cudaStreamDestroy: {}", cudaGetErrorString(err));
  }
#endif
}

Stream::Stream(Stream&& other) noexcept
    : device_(other.device_), stream_(std::exchange(other.stream_, nullptr)), counters_(std::move(other.counters_)) {}

Stream& Stream::operator=(Stream&& other) noexcept {
  if (this != &other) {
    Stream tmp(std::move(*this));
    device_ = other.device_;
    stream_ = std::exchange(other.stream_, nullptr);
    counters_ = std::move(other.counters_);
  }
  return *this;
}

H2DBytes Stream::h2d_bytes() const {
  if (!counters_) return {};
  return H2DBytes{counters_->payload.load(std::memory_order_relaxed), counters_->index.load(std::memory_order_relaxed)};
}

Status Stream::Synchronize() const {
#if SHARDCACHE_HAVE_CUDA
  if (stream_ != nullptr) SC_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
#endif
  return Status::Ok();
}

Status Stream::WaitEvent(const Event& event) const {
#if SHARDCACHE_HAVE_CUDA
  if (stream_ != nullptr && event.native() != nullptr) {
    SC_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(stream_, event.native(), 0), "cudaStreamWaitEvent");
  }
#endif
  return Status::Ok();
}

Status Stream::LaunchHostFunc(void (*fn)(void*), void* arg) const {
#if SHARDCACHE_HAVE_CUDA
  if (stream_ != nullptr) {
    SC_CUDA_RETURN_IF_ERROR(cudaLaunchHostFunc(stream_, fn, arg), "cudaLaunchHostFunc");
    return Status::Ok();
  }
#endif
  fn(arg);
  return Status::Ok();
}

Status StreamWaitEvent(NativeStream stream, const Event& event) {
#if SHARDCACHE_HAVE_CUDA
  if (event.native() != nullptr) {
    SC_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(stream, event.native(), 0), "cudaStreamWaitEvent(consumer)");
  }
#endif
  return Status::Ok();
}

Status StreamSynchronize(NativeStream stream) {
#if SHARDCACHE_HAVE_CUDA
  if (VisibleCudaDevices() > 0) {
    SC_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream), "cudaStreamSynchronize(consumer)");
  }
#endif
  return Status::Ok();
}

// ---- Event -------------------------------------------------------------------------------

Result<Event> Event::Create(const Device& device, bool timing) {
  Event e;
  e.device_ = device;
#if SHARDCACHE_HAVE_CUDA
  if (device.is_cuda()) {
    SC_RETURN_IF_ERROR(device.MakeCurrent());
    cudaEvent_t event = nullptr;
    SC_CUDA_RETURN_IF_ERROR(
        cudaEventCreateWithFlags(&event, timing ? cudaEventDefault : cudaEventDisableTiming),
        "cudaEventCreateWithFlags");
    e.event_ = event;
  }
#endif
  return e;
}

Event::~Event() {
#if SHARDCACHE_HAVE_CUDA
  if (event_ != nullptr) {
    cudaError_t err = cudaEventDestroy(event_);
    if (err != cudaSuccess) spdlog::warn("cudaEventDestroy: {}", cudaGetErrorString(err));
  }
#endif
}

Event::Event(Event&& other) noexcept
    : device_(other.device_),
      event_(std::exchange(other.event_, nullptr)),
      host_recorded_at_(other.host_recorded_at_) {}

Event& Event::operator=(Event&& other) noexcept {
  if (this != &other) {
    Event tmp(std::move(*this));
    device_ = other.device_;
    event_ = std::exchange(other.event_, nullptr);
    host_recorded_at_ = other.host_recorded_at_;
  }
  return *this;
}

Status Event::Record(const Stream& stream) { return RecordOn(stream.native()); }

Status Event::RecordOn(NativeStream stream) {
  host_recorded_at_ = std::chrono::steady_clock::now();
#if SHARDCACHE_HAVE_CUDA
  if (event_ != nullptr) SC_CUDA_RETURN_IF_ERROR(cudaEventRecord(event_, stream), "cudaEventRecord");
#endif
  return Status::Ok();
}

Result<bool> Event::Query() const {
#if SHARDCACHE_HAVE_CUDA
  if (event_ != nullptr) {
    cudaError_t err = cudaEventQuery(event_);
    if (err == cudaSuccess) return true;
    if (err == cudaErrorNotReady) return false;
    return CudaStatus(err, "cudaEventQuery");
  }
#endif
  return true;
}

Status Event::Synchronize() const {
#if SHARDCACHE_HAVE_CUDA
  if (event_ != nullptr) SC_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(event_), "cudaEventSynchronize");
#endif
  return Status::Ok();
}

Result<double> Event::ElapsedMsSince(const Event& start) const {
#if SHARDCACHE_HAVE_CUDA
  if (event_ != nullptr && start.event_ != nullptr) {
    float ms = 0;
    SC_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, start.event_, event_), "cudaEventElapsedTime");
    return static_cast<double>(ms);
  }
#endif
  return std::chrono::duration<double, std::milli>(host_recorded_at_ - start.host_recorded_at_).count();
}

// ---- OwnedBuffer (DeviceBuffer, PinnedBuffer) ---------------------------------------------

template <MemoryKind kKind, typename Pointer>
Result<OwnedBuffer<kKind, Pointer>> OwnedBuffer<kKind, Pointer>::Allocate(const Device& device, size_t bytes) {
  OwnedBuffer b;
  b.device_ = device;
  b.bytes_ = bytes;
#if SHARDCACHE_HAVE_CUDA
  if (device.is_cuda()) {
    SC_RETURN_IF_ERROR(device.MakeCurrent());
    const size_t n = bytes == 0 ? 1 : bytes;
    if constexpr (kKind == MemoryKind::kDevice) {
      SC_CUDA_RETURN_IF_ERROR(cudaMalloc(&b.data_, n), "cudaMalloc(" + std::to_string(bytes) + " bytes)");
    } else {
      SC_CUDA_RETURN_IF_ERROR(cudaMallocHost(&b.data_, n), "cudaMallocHost(" + std::to_string(bytes) + " bytes)");
    }
    return b;
  }
#endif
  b.data_ = HostAlloc(bytes);
  if (b.data_ == nullptr) return ResourceExhausted("host allocation of " + std::to_string(bytes) + " bytes");
  return b;
}

template <MemoryKind kKind, typename Pointer>
void OwnedBuffer<kKind, Pointer>::Free() {
  if (data_ == nullptr) return;
#if SHARDCACHE_HAVE_CUDA
  if (device_.is_cuda()) {
    const cudaError_t err = kKind == MemoryKind::kDevice ? cudaFree(data_) : cudaFreeHost(data_);
    if (err != cudaSuccess) {
      spdlog::warn("{}: {}", kKind == MemoryKind::kDevice ? "cudaFree" : "cudaFreeHost", cudaGetErrorString(err));
    }
    data_ = nullptr;
    return;
  }
#endif
  std::free(data_);
  data_ = nullptr;
}

template class OwnedBuffer<MemoryKind::kDevice, void*>;
template class OwnedBuffer<MemoryKind::kPinnedHost, uint8_t*>;

// ---- HostRegistration --------------------------------------------------------------------

Result<HostRegistration> HostRegistration::Register(const Device& device, void* data, size_t bytes,
                                                     bool read_only) {
  if (data == nullptr || bytes == 0) return InvalidArgument("cannot register an empty host range");
  HostRegistration r;
  r.device_ = device;
#if SHARDCACHE_HAVE_CUDA
  if (device.is_cuda()) {
    SC_RETURN_IF_ERROR(device.MakeCurrent());
    // Portable: the pinning holds for every device, so ranks sharing an arena may use any GPU.
    unsigned flags = cudaHostRegisterPortable | (read_only ? cudaHostRegisterReadOnly : 0u);
    cudaError_t err = cudaHostRegister(data, bytes, flags);
    if (err != cudaSuccess) {
      (void)cudaGetLastError();
      return CudaStatus(err, "cudaHostRegister(" + std::to_string(bytes) + " bytes)");
    }
  }
#endif
  r.data_ = data;
  r.bytes_ = bytes;
  return r;
}

void HostRegistration::Unregister() {
  if (data_ == nullptr) return;
#if SHARDCACHE_HAVE_CUDA
  if (device_.is_cuda()) {
    cudaError_t err = cudaHostUnregister(data_);
    if (err != cudaSuccess) spdlog::warn("cudaHostUnregister: {}", cudaGetErrorString(err));
  }
#endif
  data_ = nullptr;
  bytes_ = 0;
}

HostRegistration::~HostRegistration() { Unregister(); }

HostRegistration::HostRegistration(HostRegistration&& other) noexcept
    : device_(other.device_), data_(std::exchange(other.data_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}

HostRegistration& HostRegistration::operator=(HostRegistration&& other) noexcept {
  if (this != &other) {
    Unregister();
    device_ = other.device_;
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

bool HostRegistration::Contains(const void* p, size_t bytes) const {
  auto begin = reinterpret_cast<uintptr_t>(data_);
  auto q = reinterpret_cast<uintptr_t>(p);
  return data_ != nullptr && q >= begin && q + bytes <= begin + bytes_;
}

// ---- Copies ------------------------------------------------------------------------------

Status CopyAsync(const Stream& stream, void* dst, const void* src, size_t bytes, CopyKind kind,
                 H2DClass h2d_class) {
  if (bytes == 0) return Status::Ok();
  if (kind == CopyKind::kHostToDevice && stream.counters_) {
    (h2d_class == H2DClass::kPayload ? stream.counters_->payload : stream.counters_->index)
        .fetch_add(bytes, std::memory_order_relaxed);
  }
#if SHARDCACHE_HAVE_CUDA
  if (stream.native() != nullptr) {
    cudaMemcpyKind k = kind == CopyKind::kHostToDevice   ? cudaMemcpyHostToDevice
                       : kind == CopyKind::kDeviceToHost ? cudaMemcpyDeviceToHost
                                                         : cudaMemcpyDeviceToDevice;
    SC_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, src, bytes, k, stream.native()), "cudaMemcpyAsync");
    return Status::Ok();
  }
#endif
  std::memmove(dst, src, bytes);
  return Status::Ok();
}

}  // namespace shardcache::gpu
