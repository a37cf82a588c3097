// The device layer of GPU staging: one API over two backends chosen at run time.
//
// Backend::kCuda is used when the library was built with CUDA (SHARDCACHE_HAVE_CUDA) and the
// CUDA runtime reports at least one device; otherwise Backend::kHost runs the same API on host
// memory: "device" buffers are ordinary host allocations, copies and kernels run synchronously
// on the calling thread when they are enqueued, events are complete as soon as they are recorded
// and host functions run inline. Code above this layer (converter, device tier, stager) is
// written once against it, and the host path is what the tests exercise on machines without a
// GPU.
//
// Every CUDA resource is owned by one RAII object here (stream, event, device buffer, pinned
// buffer, host registration); cudaError_t becomes a Status in exactly one place (device.cc).
// Headers need no CUDA headers: native handles are the runtime's opaque pointer types.
//
// Thread safety: Device is an immutable value. Stream, Event and the buffers are move-only
// owners; distinct objects may be used from distinct threads. A CUDA call made on a thread
// that has not called Device::MakeCurrent() uses device 0 — every thread that works for a
// non-zero ordinal must call it first.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "common/status.h"

struct CUstream_st;  // cudaStream_t is CUstream_st*
struct CUevent_st;   // cudaEvent_t is CUevent_st*

namespace shardcache::gpu {

using NativeStream = CUstream_st*;
using NativeEvent = CUevent_st*;

enum class Backend { kHost, kCuda };
const char* BackendName(Backend backend);

// True when this build contains the CUDA path (nvcc was found at configure time).
bool CudaCompiledIn();
// Devices the CUDA runtime can see; 0 when CUDA is not compiled in or no driver/device exists.
int VisibleCudaDevices();

struct DeviceOptions {
  enum class Select {
    kAuto,  // CUDA when compiled in and a device is visible, else host
    kHost,  // always the host path (tests, or a trainer that wants host batches)
    kCuda,  // CUDA or fail with Unavailable
  };
  Select select = Select::kAuto;
  // CUDA device ordinal. Default: 0.
  int ordinal = 0;
};

// A chosen backend and device ordinal.
class Device {
 public:
  // Returns Unavailable when kCuda is demanded but no device is usable, InvalidArgument for an
  // ordinal the runtime does not know.
  static Result<Device> Open(const DeviceOptions& options = {});
  static Device Host() { return Device(Backend::kHost, 0); }

  Backend backend() const { return backend_; }
  bool is_cuda() const { return backend_ == Backend::kCuda; }
  int ordinal() const { return ordinal_; }
  // Makes this device current on the calling thread (cudaSetDevice); no-op on host.
  Status MakeCurrent() const;
  // "cuda:0 (NVIDIA H200, sm_90)" or "host".
  std::string Describe() const;

 private:
  Device(Backend backend, int ordinal) : backend_(backend), ordinal_(ordinal) {}
  Backend backend_;
  int ordinal_;
};

class Event;
class Stream;

enum class CopyKind { kHostToDevice, kDeviceToDevice, kDeviceToHost };

// Which host-to-device counter of its stream a copy is charged to: batch payload, or the small
// index arrays (sample offsets) that the device tier uploads per batch.
enum class H2DClass { kPayload, kIndex };

// Bytes copied host to device on one stream so far, by H2DClass.
struct H2DBytes {
  uint64_t payload = 0;
  uint64_t index = 0;
};

// cudaMemcpyAsync on `stream` (memcpy now on host). Host-to-device bytes are added to the
// stream's h2d_bytes() on both backends, so tests on the host path can assert where traffic
// would flow on a GPU.
Status CopyAsync(const Stream& stream, void* dst, const void* src, size_t bytes, CopyKind kind,
                 H2DClass h2d_class = H2DClass::kPayload);

// An asynchronous work queue (a non-blocking cudaStream_t); on host, work runs at enqueue.
class Stream {
 public:
  static Result<Stream> Create(const Device& device);
  Stream() = default;
  ~Stream();
  Stream(Stream&& other) noexcept;
  Stream& operator=(Stream&& other) noexcept;
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  const Device& device() const { return device_; }
  // The cudaStream_t; nullptr on host.
  NativeStream native() const { return stream_; }
  // Blocks the calling thread until all work queued so far has finished.
  Status Synchronize() const;
  // Work queued after this call waits for `event` (on the device, not the host).
  Status WaitEvent(const Event& event) const;
  // Runs fn(arg) once all work queued before has finished. On CUDA it runs on a runtime-owned
  // thread that must not call CUDA or block: fn should only hand work to another thread.
  // On host it runs now, on the calling thread.
  Status LaunchHostFunc(void (*fn)(void*), void* arg) const;
  // What CopyAsync has copied host to device on this stream; any thread may read it.
  H2DBytes h2d_bytes() const;

 private:
  friend Status CopyAsync(const Stream& stream, void* dst, const void* src, size_t bytes, CopyKind kind,
                          H2DClass h2d_class);
  struct Counters {
    std::atomic<uint64_t> payload{0};
    std::atomic<uint64_t> index{0};
  };
  Device device_ = Device::Host();
  NativeStream stream_ = nullptr;
  // Owned apart from the stream so that Stream stays movable; null only in a moved-from Stream.
  std::unique_ptr<Counters> counters_ = std::make_unique<Counters>();
};

// Makes a stream this library does not own (a trainer's) wait for `event`. No-op on host.
Status StreamWaitEvent(NativeStream stream, const Event& event);
// Blocks until a stream this library does not own has finished its queued work. No-op on host.
Status StreamSynchronize(NativeStream stream);

// A marker in a stream's work; complete once the work before it has run.
class Event {
 public:
  // timing=false creates the event with cudaEventDisableTiming (cheaper to record and wait on).
  static Result<Event> Create(const Device& device, bool timing = false);
  Event() = default;
  ~Event();
  Event(Event&& other) noexcept;
  Event& operator=(Event&& other) noexcept;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;

  Status Record(const Stream& stream);
  // Records on a stream this library does not own (a trainer's stream). On host: no-op.
  Status RecordOn(NativeStream stream);
  // True once the recorded work has finished (always true on host).
  Result<bool> Query() const;
  Status Synchronize() const;
  // Milliseconds between `start` and this event; both created with timing=true and complete.
  // On host: wall time between the two Record calls.
  Result<double> ElapsedMsSince(const Event& start) const;
  NativeEvent native() const { return event_; }
  const Device& device() const { return device_; }

 private:
  Device device_ = Device::Host();
  NativeEvent event_ = nullptr;
  std::chrono::steady_clock::time_point host_recorded_at_{};
};

// An owned allocation on a device: kDevice is memory the device computes on (cudaMalloc),
// kPinnedHost is page-locked host memory (cudaMallocHost); on host both are an aligned host
// allocation. Move-only; freed with the matching call.
enum class MemoryKind { kDevice, kPinnedHost };

template <MemoryKind kKind, typename Pointer>
class OwnedBuffer {
 public:
  static Result<OwnedBuffer> Allocate(const Device& device, size_t bytes);
  OwnedBuffer() = default;
  ~OwnedBuffer() { Free(); }
  OwnedBuffer(OwnedBuffer&& other) noexcept
      : device_(other.device_), data_(std::exchange(other.data_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}
  OwnedBuffer& operator=(OwnedBuffer&& other) noexcept {
    if (this != &other) {
      Free();
      device_ = other.device_;
      data_ = std::exchange(other.data_, nullptr);
      bytes_ = std::exchange(other.bytes_, 0);
    }
    return *this;
  }
  OwnedBuffer(const OwnedBuffer&) = delete;
  OwnedBuffer& operator=(const OwnedBuffer&) = delete;

  Pointer data() const { return static_cast<Pointer>(data_); }
  size_t bytes() const { return bytes_; }

 private:
  void Free();
  Device device_ = Device::Host();
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

using DeviceBuffer = OwnedBuffer<MemoryKind::kDevice, void*>;
using PinnedBuffer = OwnedBuffer<MemoryKind::kPinnedHost, uint8_t*>;

// Page-locks an existing host range (cudaHostRegister) for the object's lifetime, so copies
// from it run at the bus's pinned speed without a bounce. Pinning costs ~1-2 GB/s: register a
// whole arena once, never per batch. On host: nothing to do, always succeeds.
class HostRegistration {
 public:
  // Fails (the caller falls back to a bounce pool) when the range cannot be pinned, e.g. under
  // a low RLIMIT_MEMLOCK or for memory the driver does not support.
  // read_only: the range is mapped without PROT_WRITE (cudaHostRegisterReadOnly; the device
  // must report cudaDevAttrHostRegisterReadOnlySupported, as Hopper does).
  static Result<HostRegistration> Register(const Device& device, void* data, size_t bytes,
                                           bool read_only = false);
  HostRegistration() = default;
  ~HostRegistration();
  HostRegistration(HostRegistration&& other) noexcept;
  HostRegistration& operator=(HostRegistration&& other) noexcept;
  HostRegistration(const HostRegistration&) = delete;
  HostRegistration& operator=(const HostRegistration&) = delete;

  bool Contains(const void* p, size_t bytes) const;
  bool registered() const { return data_ != nullptr; }

 private:
  void Unregister();
  Device device_ = Device::Host();
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace shardcache::gpu
