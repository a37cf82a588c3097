#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "common/mutex.h"

using namespace shardcache;
using namespace std::chrono_literals;

namespace {

// A counter whose value is guarded: the clang check (tests/style/thread_safety.sh) checks this
// file too.
class Counter {
 public:
  void Add() {
    MutexLock l(&mu_);
    ++n_;
  }
  int Get() const {
    MutexLock l(&mu_);
    return n_;
  }

 private:
  mutable Mutex mu_;
  int n_ GUARDED_BY(mu_) = 0;
};

// A one-slot mailbox: Put() waits for room, Take() for a value.
class Mailbox {
 public:
  void Put(int v) {
    MutexLock l(&mu_);
    cv_.Wait(&mu_, [&]() REQUIRES(mu_) { return !full_; });
    value_ = v;
    full_ = true;
    cv_.NotifyAll();
  }
  int Take() {
    MutexLock l(&mu_);
    cv_.Wait(&mu_, [&]() REQUIRES(mu_) { return full_; });
    full_ = false;
    cv_.NotifyAll();
    return value_;
  }
  // False when nothing came within `d`.
  bool TakeFor(std::chrono::milliseconds d, int* v) {
    MutexLock l(&mu_);
    if (!cv_.WaitFor(&mu_, d, [&]() REQUIRES(mu_) { return full_; })) return false;
    full_ = false;
    *v = value_;
    cv_.NotifyAll();
    return true;
  }

 private:
  Mutex mu_;
  CondVar cv_;
  int value_ GUARDED_BY(mu_) = 0;
  bool full_ GUARDED_BY(mu_) = false;
};

}  // namespace

// Whether another thread can take `mu` now (it lets go at once).
static bool FreeElsewhere(Mutex* mu) {
  bool got = false;
  std::thread([&] {
    if (mu->TryLock()) {
      got = true;
      mu->Unlock();
    }
  }).join();
  return got;
}

TEST_CASE("Mutex: Lock, Unlock and TryLock") {
  Mutex mu;
  bool locked = false;
  if (mu.TryLock()) {
    locked = true;
    // Held: another thread's TryLock fails (std::mutex::try_lock by the owner is undefined).
    CHECK_FALSE(FreeElsewhere(&mu));
    mu.Unlock();
  }
  CHECK(locked);
  CHECK(FreeElsewhere(&mu));
  mu.Lock();
  mu.AssertHeld();
  CHECK_FALSE(FreeElsewhere(&mu));
  mu.Unlock();
  CHECK(FreeElsewhere(&mu));
}

TEST_CASE("MutexLock holds the mutex for its scope, and Unlock/Lock release and retake it") {
  Mutex mu;
  {
    MutexLock l(&mu);
    CHECK_FALSE(FreeElsewhere(&mu));
    l.Unlock();
    CHECK(FreeElsewhere(&mu));
    l.Lock();
    CHECK_FALSE(FreeElsewhere(&mu));
  }
  CHECK(FreeElsewhere(&mu));
  {
    MutexLock l(&mu);
    l.Unlock();  // the destructor does not unlock again
  }
  CHECK(FreeElsewhere(&mu));
}

TEST_CASE("MutexLock excludes other threads") {
  Counter c;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 10000; ++i) c.Add();
    });
  }
  for (auto& t : threads) t.join();
  CHECK(c.Get() == 40000);
}

TEST_CASE("CondVar: Wait with a predicate hands values between threads") {
  Mailbox box;
  std::thread producer([&] {
    for (int i = 1; i <= 1000; ++i) box.Put(i);
  });
  long sum = 0;
  for (int i = 1; i <= 1000; ++i) sum += box.Take();
  producer.join();
  CHECK(sum == 1000L * 1001 / 2);
}

TEST_CASE("CondVar: WaitFor and WaitUntil time out, and return early when notified") {
  Mailbox box;
  int v = 0;
  const auto t0 = std::chrono::steady_clock::now();
  CHECK_FALSE(box.TakeFor(30ms, &v));
  CHECK(std::chrono::steady_clock::now() - t0 >= 30ms);

  std::thread late([&] {
    std::this_thread::sleep_for(20ms);
    box.Put(7);
  });
  CHECK(box.TakeFor(10s, &v));
  CHECK(v == 7);
  late.join();

  Mutex mu;
  CondVar cv;
  MutexLock l(&mu);
  CHECK(cv.WaitUntil(&mu, std::chrono::steady_clock::now() + 10ms) == std::cv_status::timeout);
  CHECK(cv.WaitFor(&mu, 10ms) == std::cv_status::timeout);
  CHECK_FALSE(cv.WaitUntil(&mu, std::chrono::steady_clock::now() + 10ms, [] { return false; }));
  CHECK(cv.WaitUntil(&mu, std::chrono::steady_clock::now() + 10s, [] { return true; }));
  // The mutex is held again after each wait.
  CHECK_FALSE(FreeElsewhere(&mu));
}

TEST_CASE("CondVar: plain Wait wakes on NotifyOne") {
  Mutex mu;
  CondVar cv;
  bool ready = false;
  std::thread t([&] {
    std::this_thread::sleep_for(10ms);
    MutexLock l(&mu);
    ready = true;
    cv.NotifyOne();
  });
  {
    MutexLock l(&mu);
    while (!ready) cv.Wait(&mu);
  }
  t.join();
  CHECK(ready);
}

TEST_CASE("SharedMutex: readers share it, a writer excludes them") {
  SharedMutex mu;
  std::atomic<int> readers{0};
  std::atomic<int> max_readers{0};
  std::atomic<bool> go{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < 3; ++t) {
    threads.emplace_back([&] {
      while (!go) std::this_thread::yield();
      ReaderMutexLock l(&mu);
      const int now = ++readers;
      int m = max_readers;
      while (now > m && !max_readers.compare_exchange_weak(m, now)) {}
      // Stay until every reader is in (they can all hold it at once), or give up after 5 s.
      const auto until = std::chrono::steady_clock::now() + 5s;
      while (max_readers < 3 && std::chrono::steady_clock::now() < until) std::this_thread::yield();
      --readers;
    });
  }
  go = true;
  for (auto& t : threads) t.join();
  CHECK(max_readers == 3);

  // A reader that starts while the writer holds it sees the writer's value.
  int value = 0;
  int seen = -1;
  std::thread reader;
  {
    WriterMutexLock w(&mu);
    reader = std::thread([&] {
      ReaderMutexLock l(&mu);
      seen = value;
    });
    std::this_thread::sleep_for(20ms);
    value = 1;
  }
  reader.join();
  CHECK(seen == 1);
}
