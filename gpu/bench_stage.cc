// bench_stage: GPU staging figures, measured side by side in one run (BENCH.md's rule).
//
//   1. peak:    plain cudaMemcpyAsync from cudaMallocHost memory into a device buffer, batch by
//               batch on one stream — the bus's pinned-copy rate on this machine.
//   2. stager:  the Stager copying the same batch size out of a registered memfd arena (as the
//               client's shared memory is), consumer doing nothing: over_peak = stager / peak.
//               Also the bounce-pool rate (arena not registered), for reference.
//   3. loop:    a synthetic training loop — per step: Next(), the trainer stream waits on the
//               batch's ready event, a spin kernel of fixed duration "computes" on it. With the
//               step at least 2× the copy time the copies should hide completely:
//               stall_fraction = (loop GPU time − steps × spin time alone) / loop GPU time.
//
// On the host backend (no GPU) the same program runs with memcpy and a host busy-wait as the
// step; its figures then only describe this machine's memory bandwidth.
// Prints a readable report; the last stdout line is one JSON object. Exit 1 if it could not
// measure.
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <optional>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <spdlog/spdlog.h>

#include "gpu/device.h"
#include "gpu/stager.h"

#if SHARDCACHE_HAVE_CUDA
#include "gpu/kernels.h"
#endif

using namespace shardcache;
using namespace shardcache::gpu;
using Clock = std::chrono::steady_clock;

namespace {

struct Args {
  uint64_t batch_mib = 64;
  int arena_slots = 8;
  int batches = 150;  // per stager epoch
  int depth = 2;
  int steps = 200;
  double step_over_copy = 2.5;  // step time ÷ copy time in the training loop
  bool host = false;            // force the host backend
  bool cuda = false;            // demand a GPU (fail rather than measure the host path)
};

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "bench_stage: %s\n", what.c_str());
  std::exit(1);
}

template <typename T>
T Check(Result<T> r, const char* what) {
  if (!r.ok()) Die(std::string(what) + ": " + r.status().ToString());
  return std::move(r).value();
}
void Check(const Status& st, const char* what) {
  if (!st.ok()) Die(std::string(what) + ": " + st.ToString());
}

Args Parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string k = argv[i];
    auto val = [&]() -> const char* {
      if (i + 1 >= argc) Die("missing value for " + k);
      return argv[++i];
    };
    if (k == "--batch-mib") a.batch_mib = std::strtoull(val(), nullptr, 10);
    else if (k == "--arena-slots") a.arena_slots = std::atoi(val());
    else if (k == "--batches") a.batches = std::atoi(val());
    else if (k == "--depth") a.depth = std::atoi(val());
    else if (k == "--steps") a.steps = std::atoi(val());
    else if (k == "--step-over-copy") a.step_over_copy = std::atof(val());
    else if (k == "--host") a.host = true;
    else if (k == "--cuda") a.cuda = true;
    else if (k == "--quick") { a.batch_mib = 16; a.batches = 40; a.steps = 40; }
    else Die("unknown option " + k + " (--batch-mib N --arena-slots N --batches N --depth N --steps N "
             "--step-over-copy X --host|--cuda --quick)");
  }
  if (a.batch_mib == 0 || a.arena_slots < 2 || a.batches < 4 || a.depth < 1 || a.steps < 4) Die("bad sizes");
  return a;
}

// The client's shared memory: a memfd mapped MAP_SHARED, cut into slots handed out round-robin
// and given back by the stager's release callback.
class Arena {
 public:
  Arena(uint64_t slot_bytes, int slots) : slot_bytes_(slot_bytes), slots_(slots) {
    bytes_ = slot_bytes * slots;
    fd_ = memfd_create("bench-stage-arena", MFD_CLOEXEC);
    if (fd_ < 0 || ftruncate(fd_, static_cast<off_t>(bytes_)) != 0) Die("memfd arena");
    void* p = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
    if (p == MAP_FAILED) Die("mmap arena");
    data_ = static_cast<uint8_t*>(p);
    for (uint64_t i = 0; i < bytes_; i += 4096) data_[i] = static_cast<uint8_t>(i >> 12);  // fault in
    for (int i = 0; i < slots; ++i) free_.push_back(i);
  }
  ~Arena() {
    munmap(data_, bytes_);
    close(fd_);
  }
  uint8_t* data() const { return data_; }
  uint64_t bytes() const { return bytes_; }

  HostBatchSource Source(int batches) {
    remaining_ = batches;
    return [this]() -> Result<std::optional<HostBatch>> {
      if (remaining_-- <= 0) return std::optional<HostBatch>();
      int slot;
      {
        MutexLock lock(&mu_);
        cv_.Wait(&mu_, [&]() REQUIRES(mu_) { return !free_.empty(); });
        slot = free_.back();
        free_.pop_back();
      }
      HostBatch hb;
      hb.data = data_ + slot * slot_bytes_;
      hb.bytes = slot_bytes_;
      hb.records = 1;
      hb.record_bytes = slot_bytes_;
      hb.release = [this, slot] {
        MutexLock l(&mu_);
        free_.push_back(slot);
        cv_.NotifyOne();
      };
      return std::optional<HostBatch>(std::move(hb));
    };
  }

 private:
  uint64_t slot_bytes_;
  int slots_;
  uint64_t bytes_ = 0;
  int fd_ = -1;
  uint8_t* data_ = nullptr;
  Mutex mu_;
  CondVar cv_;
  std::vector<int> free_ GUARDED_BY(mu_);
  int remaining_ = 0;
};

StagerOptions StagerFor(const Args& a, const gpu::Device& dev, Arena& arena, bool bounce) {
  StagerOptions o;
  o.depth = a.depth;
  o.max_batch_bytes = a.batch_mib << 20;
  o.record_bytes = a.batch_mib << 20;
  o.device.select = dev.is_cuda() ? gpu::DeviceOptions::Select::kCuda : gpu::DeviceOptions::Select::kHost;
  o.device.ordinal = dev.ordinal();
  o.arena = arena.data();
  o.arena_bytes = arena.bytes();
  o.force_bounce = bounce;
  return o;
}

// Plain pinned copies: GB/s.
double PeakRate(const gpu::Device& dev, uint64_t bytes, int copies) {
  auto pinned = Check(gpu::PinnedBuffer::Allocate(dev, bytes), "pinned buffer");
  std::memset(pinned.data(), 1, bytes);
  auto dst = Check(gpu::DeviceBuffer::Allocate(dev, bytes), "device buffer");
  auto stream = Check(gpu::Stream::Create(dev), "stream");
  auto start = Check(gpu::Event::Create(dev, true), "event");
  auto end = Check(gpu::Event::Create(dev, true), "event");
  for (int i = 0; i < 3; ++i) Check(gpu::CopyAsync(stream, dst.data(), pinned.data(), bytes, gpu::CopyKind::kHostToDevice), "copy");
  Check(stream.Synchronize(), "sync");
  Check(start.Record(stream), "record");
  for (int i = 0; i < copies; ++i) {
    Check(gpu::CopyAsync(stream, dst.data(), pinned.data(), bytes, gpu::CopyKind::kHostToDevice), "copy");
  }
  Check(end.Record(stream), "record");
  Check(end.Synchronize(), "sync");
  double ms = Check(end.ElapsedMsSince(start), "elapsed");
  return static_cast<double>(bytes) * copies / (ms / 1e3) / 1e9;
}

// One stager epoch with an idle consumer: GB/s from the first Next() to the last batch ready.
double StagerRate(const Args& a, const gpu::Device& dev, Arena& arena, Stager& stager, int batches) {
  auto consumer = Check(gpu::Stream::Create(dev), "stream");
  auto done = Check(gpu::Event::Create(dev), "event");
  auto t0 = Clock::now();
  Check(stager.Start(arena.Source(batches)), "start");
  uint64_t bytes = 0;
  for (;;) {
    auto b = Check(stager.Next(), "next");
    if (!b.has_value()) break;
    Check(b->WaitOn(consumer.native()), "wait");
    bytes += b->tensor(0).bytes();
  }
  Check(done.Record(consumer), "record");
  Check(done.Synchronize(), "sync");
  double s = std::chrono::duration<double>(Clock::now() - t0).count();
  return static_cast<double>(bytes) / s / 1e9;
}

// Runs one step of "compute" on the trainer stream: the spin kernel, or a host busy-wait.
void Step(const gpu::Device& dev, const gpu::Stream& train, uint64_t ns, const void* touch) {
#if SHARDCACHE_HAVE_CUDA
  if (dev.is_cuda()) {
    int err = gpu::kernels::LaunchSpin(ns, touch, train.native());
    if (err != 0) Die("spin kernel launch failed: " + std::to_string(err));
    return;
  }
#endif
  auto until = Clock::now() + std::chrono::nanoseconds(ns);
  while (Clock::now() < until) {
  }
}

// The synthetic training loop: `steps` steps of step_over_copy × the copy time on a trainer
// stream fed by the stager, against the same steps with no stager (the ideal).
struct Loop {
  double copy_ms = 0;
  uint64_t step_ns = 0;
  int steps = 0;
  double loop_ms = 0, ideal_ms = 0, stall = 0;
};

Loop TrainingLoop(const Args& a, const gpu::Device& dev, Arena& arena, Stager& stager, double peak) {
  const uint64_t batch_bytes = a.batch_mib << 20;
  const double copy_ms = static_cast<double>(batch_bytes) / (peak * 1e9) * 1e3;
  const uint64_t step_ns = static_cast<uint64_t>(copy_ms * a.step_over_copy * 1e6);
  auto train = Check(gpu::Stream::Create(dev), "stream");
  auto t_start = Check(gpu::Event::Create(dev, true), "event");
  auto t_end = Check(gpu::Event::Create(dev, true), "event");
  // The spin kernel alone, same count, same stream: what the loop would take with no stalls.
  Check(train.Synchronize(), "sync");
  Check(t_start.Record(train), "record");
  for (int i = 0; i < a.steps; ++i) Step(dev, train, step_ns, nullptr);
  Check(t_end.Record(train), "record");
  Check(t_end.Synchronize(), "sync");
  double spin_ms = Check(t_end.ElapsedMsSince(t_start), "elapsed");

  Check(stager.Start(arena.Source(a.steps + 1)), "start");
  // The first batch fills the pipeline; timing starts once the trainer has it.
  auto first = Check(stager.Next(), "next");
  if (!first.has_value()) Die("no first batch");
  Check(first->WaitOn(train.native()), "wait");
  Check(train.Synchronize(), "sync");
  Check(t_start.Record(train), "record");
  Step(dev, train, step_ns, first->tensor(0).data);
  first.reset();
  int steps = 1;
  for (;;) {
    auto b = Check(stager.Next(), "next");
    if (!b.has_value()) break;
    Check(b->WaitOn(train.native()), "wait");
    Step(dev, train, step_ns, b->tensor(0).data);
    ++steps;
  }
  Check(t_end.Record(train), "record");
  Check(t_end.Synchronize(), "sync");
  double loop_ms = Check(t_end.ElapsedMsSince(t_start), "elapsed");
  double ideal_ms = spin_ms * steps / a.steps;
  double stall = std::max(0.0, loop_ms - ideal_ms) / loop_ms;
  std::printf("  training loop: %d steps of %.3f ms (copy %.3f ms, ratio %.1f): %.1f ms vs %.1f ms of "
              "compute → stall_fraction %.4f\n", steps, step_ns / 1e6, copy_ms, a.step_over_copy, loop_ms,
              ideal_ms, stall);
  return Loop{copy_ms, step_ns, steps, loop_ms, ideal_ms, stall};
}

}  // namespace

int main(int argc, char** argv) {
  Args a = Parse(argc, argv);
  spdlog::set_level(spdlog::level::warn);
  gpu::DeviceOptions dopt;
  if (a.host) dopt.select = gpu::DeviceOptions::Select::kHost;
  if (a.cuda) dopt.select = gpu::DeviceOptions::Select::kCuda;
  gpu::Device dev = Check(gpu::Device::Open(dopt), "device");
  const uint64_t batch_bytes = a.batch_mib << 20;
  std::printf("bench_stage on %s: batches of %llu MiB, depth %d, arena %d slots\n", dev.Describe().c_str(),
              static_cast<unsigned long long>(a.batch_mib), a.depth, a.arena_slots);

  Arena arena(batch_bytes, a.arena_slots);

  // 1. Peak pinned copy rate.
  double peak = PeakRate(dev, batch_bytes, a.batches);
  std::printf("  plain cudaMemcpyAsync from pinned memory: %.2f GB/s\n", peak);

  // 2. Stager rate, registered arena (one warm-up epoch first: thread start, first touches).
  auto reg_t0 = Clock::now();
  auto stager = Check(Stager::Create(StagerFor(a, dev, arena, false)), "stager");
  double register_s = std::chrono::duration<double>(Clock::now() - reg_t0).count();
  if (!stager->Stats().arena_registered) std::printf("  NOTE: arena registration failed; stager bounces\n");
  (void)StagerRate(a, dev, arena, *stager, std::max(4, a.batches / 10));
  double staged = StagerRate(a, dev, arena, *stager, a.batches);
  double over_peak = staged / peak;
  std::printf("  stager from the registered arena:          %.2f GB/s  (over_peak %.3f; setup incl. "
              "registration %.2f s)\n", staged, over_peak, register_s);

  double bounced = 0;
  {
    auto bs = Check(Stager::Create(StagerFor(a, dev, arena, true)), "bounce stager");
    (void)StagerRate(a, dev, arena, *bs, 2 * a.depth);  // first touches of the bounce buffers
    bounced = StagerRate(a, dev, arena, *bs, std::max(4, a.batches / 3));
    std::printf("  stager through the bounce pool:            %.2f GB/s\n", bounced);
  }

  // 3. Synthetic training loop with the step at step_over_copy × the copy time.
  const Loop loop = TrainingLoop(a, dev, arena, *stager, peak);
  stager.reset();

  std::printf(
      "{\"scenario\":\"gpu_stage\",\"backend\":\"%s\",\"device\":\"%s\",\"batch_bytes\":%llu,\"depth\":%d,"
      "\"peak_gbps\":%.3f,\"stager_gbps\":%.3f,\"over_peak\":%.4f,\"bounce_gbps\":%.3f,"
      "\"register_s\":%.3f,\"copy_ms\":%.4f,\"step_ms\":%.4f,\"steps\":%d,\"loop_ms\":%.2f,"
      "\"compute_ms\":%.2f,\"stall_fraction\":%.5f}\n",
      gpu::BackendName(dev.backend()), dev.Describe().c_str(), static_cast<unsigned long long>(batch_bytes),
      a.depth, peak, staged, over_peak, bounced, register_s, loop.copy_ms, loop.step_ns / 1e6, loop.steps,
      loop.loop_ms, loop.ideal_ms, loop.stall);
  return 0;
}
