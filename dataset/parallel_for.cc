#include "dataset/parallel_for.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "common/mutex.h"

namespace shardcache::dataset {

unsigned DefaultThreads(unsigned requested) {
  if (requested > 0) return requested;
  return std::max(1u, std::thread::hardware_concurrency());
}

Status ParallelFor(uint64_t count, unsigned threads, const std::function<Status(uint64_t)>& fn,
                   const std::function<void()>& tick, unsigned tick_ms) {
  if (count == 0) {
    if (tick) tick();
    return Status::Ok();
  }
  const unsigned n = static_cast<unsigned>(std::min<uint64_t>(DefaultThreads(threads), count));
  std::atomic<uint64_t> next{0};
  std::atomic<bool> failed{false};
  Mutex mu;
  CondVar done_cv;
  unsigned running = n;  // guarded by mu
  Status first_error;    // guarded by mu

  auto worker = [&] {
    for (;;) {
      if (failed.load(std::memory_order_relaxed)) break;
      const uint64_t i = next.fetch_add(1, std::memory_order_relaxed);
      if (i >= count) break;
      Status s = fn(i);
      if (!s.ok()) {
        MutexLock lock(&mu);
        if (first_error.ok()) first_error = std::move(s);
        failed.store(true);
      }
    }
    MutexLock lock(&mu);
    if (--running == 0) done_cv.NotifyAll();
  };

  std::vector<std::thread> pool;
  pool.reserve(n);
  for (unsigned t = 0; t < n; ++t) pool.emplace_back(worker);
  {
    MutexLock lock(&mu);
    while (running > 0) {
      done_cv.WaitFor(&mu, std::chrono::milliseconds(tick_ms));
      if (tick && running > 0) {
        lock.Unlock();
        tick();
        lock.Lock();
      }
    }
  }
  for (auto& t : pool) t.join();
  if (tick) tick();
  return first_error;
}

}  // namespace shardcache::dataset
