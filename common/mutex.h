// Mutexes the clang thread-safety analysis understands (common/thread_annotations.h): Mutex
// and SharedMutex wrap std::mutex / std::shared_mutex, MutexLock / ReaderMutexLock /
// WriterMutexLock hold them for a scope, and CondVar waits on a Mutex the caller holds.
//
//   mutable Mutex mu_;
//   CondVar cv_;
//   std::deque<Item> queue_ GUARDED_BY(mu_);
//   bool stop_ GUARDED_BY(mu_) = false;
//
//   void Push(Item i) { MutexLock l(&mu_); queue_.push_back(std::move(i)); cv_.NotifyOne(); }
//   void WaitForWork() {
//     MutexLock l(&mu_);
//     cv_.Wait(&mu_, [&]() REQUIRES(mu_) { return stop_ || !queue_.empty(); });
//   }
//
// A predicate that reads guarded members says REQUIRES(mu) (it runs with the mutex held);
// without it the analysis sees the lambda as a function of its own and flags each read.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <shared_mutex>
#include <utility>

#include "common/thread_annotations.h"

namespace shardcache {

class CAPABILITY("mutex") Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void Lock() ACQUIRE() { mu_.lock(); }
  void Unlock() RELEASE() { mu_.unlock(); }
  bool TryLock() TRY_ACQUIRE(true) { return mu_.try_lock(); }
  // Tells the analysis that the caller holds the mutex (no run-time check: std::mutex does not
  // know its owner). For code the analysis cannot follow, e.g. a callback run under the lock.
  void AssertHeld() const ASSERT_CAPABILITY(this) {}

  // The std::mutex, for code that needs one (CondVar uses it). Locking it directly bypasses
  // the analysis.
  std::mutex& native() { return mu_; }

 private:
  std::mutex mu_;
};

// Holds a Mutex from construction to the end of the scope. Unlock() / Lock() release and take
// it again inside the scope (the destructor unlocks only when it is held).
class SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex* mu) ACQUIRE(mu) : mu_(mu) { mu_->Lock(); }
  ~MutexLock() RELEASE() {
    if (held_) mu_->Unlock();
  }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

  void Unlock() RELEASE() {
    held_ = false;
    mu_->Unlock();
  }
  void Lock() ACQUIRE() {
    mu_->Lock();
    held_ = true;
  }

 private:
  Mutex* const mu_;
  bool held_ = true;
};

// A condition variable for a Mutex. Every wait requires the mutex held, releases it while
// blocked and holds it again when it returns, like std::condition_variable with a unique_lock.
class CondVar {
 public:
  CondVar() = default;
  CondVar(const CondVar&) = delete;
  CondVar& operator=(const CondVar&) = delete;

  void Wait(Mutex* mu) REQUIRES(mu) {
    std::unique_lock<std::mutex> l(mu->native(), std::adopt_lock);
    cv_.wait(l);
    l.release();  // the caller's MutexLock still owns it
  }
  // Until pred() holds (checked with the mutex held, before the first wait too).
  template <class Predicate>
  void Wait(Mutex* mu, Predicate pred) REQUIRES(mu) {
    std::unique_lock<std::mutex> l(mu->native(), std::adopt_lock);
    cv_.wait(l, std::move(pred));
    l.release();
  }

  // std::cv_status::timeout when `t` passed first.
  template <class Clock, class Duration>
  std::cv_status WaitUntil(Mutex* mu, const std::chrono::time_point<Clock, Duration>& t) REQUIRES(mu) {
    std::unique_lock<std::mutex> l(mu->native(), std::adopt_lock);
    const std::cv_status s = cv_.wait_until(l, t);
    l.release();
    return s;
  }
  // pred()'s last value: false when `t` passed first.
  template <class Clock, class Duration, class Predicate>
  bool WaitUntil(Mutex* mu, const std::chrono::time_point<Clock, Duration>& t, Predicate pred) REQUIRES(mu) {
    std::unique_lock<std::mutex> l(mu->native(), std::adopt_lock);
    const bool ok = cv_.wait_until(l, t, std::move(pred));
    l.release();
    return ok;
  }

  template <class Rep, class Period>
  std::cv_status WaitFor(Mutex* mu, const std::chrono::duration<Rep, Period>& d) REQUIRES(mu) {
    std::unique_lock<std::mutex> l(mu->native(), std::adopt_lock);
    const std::cv_status s = cv_.wait_for(l, d);
    l.release();
    return s;
  }
  template <class Rep, class Period, class Predicate>
  bool WaitFor(Mutex* mu, const std::chrono::duration<Rep, Period>& d, Predicate pred) REQUIRES(mu) {
    std::unique_lock<std::mutex> l(mu->native(), std::adopt_lock);
    const bool ok = cv_.wait_for(l, d, std::move(pred));
    l.release();
    return ok;
  }

  void NotifyOne() noexcept { cv_.notify_one(); }
  void NotifyAll() noexcept { cv_.notify_all(); }

 private:
  std::condition_variable cv_;
};

// A reader/writer mutex: Lock() for writers, ReaderLock() for readers who share it.
class CAPABILITY("shared_mutex") SharedMutex {
 public:
  SharedMutex() = default;
  SharedMutex(const SharedMutex&) = delete;
  SharedMutex& operator=(const SharedMutex&) = delete;

  void Lock() ACQUIRE() { mu_.lock(); }
  void Unlock() RELEASE() { mu_.unlock(); }
  void ReaderLock() ACQUIRE_SHARED() { mu_.lock_shared(); }
  void ReaderUnlock() RELEASE_SHARED() { mu_.unlock_shared(); }
  void AssertHeld() const ASSERT_CAPABILITY(this) {}
  void AssertReaderHeld() const ASSERT_SHARED_CAPABILITY(this) {}

 private:
  std::shared_mutex mu_;
};

class SCOPED_CAPABILITY WriterMutexLock {
 public:
  explicit WriterMutexLock(SharedMutex* mu) ACQUIRE(mu) : mu_(mu) { mu_->Lock(); }
  ~WriterMutexLock() RELEASE() { mu_->Unlock(); }
  WriterMutexLock(const WriterMutexLock&) = delete;
  WriterMutexLock& operator=(const WriterMutexLock&) = delete;

 private:
  SharedMutex* const mu_;
};

class SCOPED_CAPABILITY ReaderMutexLock {
 public:
  explicit ReaderMutexLock(SharedMutex* mu) ACQUIRE_SHARED(mu) : mu_(mu) { mu_->ReaderLock(); }
  ~ReaderMutexLock() RELEASE() { mu_->ReaderUnlock(); }
  ReaderMutexLock(const ReaderMutexLock&) = delete;
  ReaderMutexLock& operator=(const ReaderMutexLock&) = delete;

 private:
  SharedMutex* const mu_;
};

}  // namespace shardcache
