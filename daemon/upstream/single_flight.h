// SingleFlight<Key, Value>: at most one computation per key at a time; everyone else who asks
// for the same key while it runs waits for that one result ("single-flight", as in Go's
// golang.org/x/sync/singleflight). The upstream client uses it per chunk so that however many
// callers want a chunk, it crosses the link once; the cache tiers reuse it for fills.
//
//   auto flight = sf.Join(key);
//   if (flight.leader()) { ...compute...; flight.Publish(value); }
//   else { auto v = flight.Wait(deadline); }      // nullopt when the deadline passed
//
// A leader's Flight that is destroyed without Publish publishes Value(Aborted(...)), so a
// leader that fails or throws never strands its followers: Value must be constructible from a
// Status (Result<T> is). Once published, the key leaves the table: the next Join starts a new
// flight (results are not cached here — that is the cache's job).
//
// Thread safety: all methods are thread-safe. A Flight object itself is used by one thread.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <optional>
#include <unordered_map>
#include <utility>

#include "common/mutex.h"
#include "common/status.h"

namespace shardcache::upstream {

template <typename Key, typename Value, typename Hash = std::hash<Key>>
class SingleFlight {
  struct Call {
    Mutex mu;
    CondVar cv;
    std::optional<Value> value GUARDED_BY(mu);
    std::atomic<bool> wanted{false};  // see Flight::MarkWanted
  };

 public:
  class Flight {
   public:
    Flight() = default;
    Flight(Flight&& o) noexcept { *this = std::move(o); }
    Flight& operator=(Flight&& o) noexcept {
      if (this != &o) {
        Abandon();
        owner_ = std::exchange(o.owner_, nullptr);
        key_ = std::move(o.key_);
        call_ = std::move(o.call_);
        leader_ = std::exchange(o.leader_, false);
      }
      return *this;
    }
    Flight(const Flight&) = delete;
    Flight& operator=(const Flight&) = delete;
    ~Flight() { Abandon(); }

    // True when this caller must compute the value and Publish it.
    bool leader() const { return leader_; }

    // A follower handle on the same flight (for a leader that hands its Flight to a worker
    // but still wants to Wait for the value itself).
    Flight Share() const {
      Flight f;
      f.owner_ = owner_;
      f.key_ = key_;
      f.call_ = call_;
      return f;
    }

    // REQUIRES: leader(). Hands `v` to every waiter and removes the key from the table.
    void Publish(Value v) {
      if (!leader_) return;
      leader_ = false;
      owner_->Finish(key_, call_, std::move(v));
    }

    // Waits for the published value. nullopt when `deadline` passes first. For a leader this
    // returns its own published value (after Publish).
    std::optional<Value> Wait(std::chrono::steady_clock::time_point deadline) const {
      MutexLock lock(&call_->mu);
      if (!call_->cv.WaitUntil(&call_->mu, deadline,
                               [&]() REQUIRES(call_->mu) { return call_->value.has_value(); })) {
        return std::nullopt;
      }
      return call_->value;
    }
    // A caller that needs the value now (not ahead of time) marks the flight, so that the
    // leader's work can be given that caller's urgency (GrpcSource hedges it when it is stuck).
    void MarkWanted() const { call_->wanted.store(true); }
    bool wanted() const { return call_ != nullptr && call_->wanted.load(); }

    // Non-blocking: the value when already published.
    std::optional<Value> TryGet() const {
      MutexLock lock(&call_->mu);
      return call_->value;
    }

   private:
    friend class SingleFlight;
    void Abandon() {
      if (leader_) Publish(Value(Aborted("single-flight leader gave up before publishing")));
    }
    SingleFlight* owner_ = nullptr;
    Key key_{};
    std::shared_ptr<Call> call_;
    bool leader_ = false;
  };

  SingleFlight() = default;
  SingleFlight(const SingleFlight&) = delete;
  SingleFlight& operator=(const SingleFlight&) = delete;

  // Joins the flight for `key`, starting it (leader) when none is running.
  Flight Join(const Key& key) {
    Flight f;
    f.owner_ = this;
    f.key_ = key;
    MutexLock lock(&mu_);
    auto [it, inserted] = calls_.try_emplace(key);
    if (inserted) it->second = std::make_shared<Call>();
    f.call_ = it->second;
    f.leader_ = inserted;
    return f;
  }

  // Whether a flight for `key` runs now (a Join would follow it, unless it ends first).
  bool Running(const Key& key) {
    MutexLock lock(&mu_);
    return calls_.count(key) > 0;
  }

  // Marks the running flight for `key` wanted (Flight::MarkWanted); nothing when none runs.
  void MarkWanted(const Key& key) {
    MutexLock lock(&mu_);
    auto it = calls_.find(key);
    if (it != calls_.end()) it->second->wanted.store(true);
  }

  // Convenience: runs fn() when leader, else waits (until `deadline`; then returns
  // Value(DeadlineExceeded)).
  template <typename Fn>
  Value Do(const Key& key, std::chrono::steady_clock::time_point deadline, Fn&& fn) {
    Flight f = Join(key);
    if (f.leader()) {
      Value v = fn();
      f.Publish(v);
      return v;
    }
    auto v = f.Wait(deadline);
    if (!v) return Value(DeadlineExceeded("timed out waiting for a fetch started by another caller"));
    return std::move(*v);
  }

  // Flights currently running (tests, metrics).
  size_t InFlight() const {
    MutexLock lock(&mu_);
    return calls_.size();
  }

 private:
  void Finish(const Key& key, const std::shared_ptr<Call>& call, Value v) {
    {
      MutexLock lock(&mu_);
      auto it = calls_.find(key);
      if (it != calls_.end() && it->second == call) calls_.erase(it);
    }
    {
      MutexLock lock(&call->mu);
      call->value = std::move(v);
    }
    call->cv.NotifyAll();
  }

  mutable Mutex mu_;
  std::unordered_map<Key, std::shared_ptr<Call>, Hash> calls_ GUARDED_BY(mu_);
};

}  // namespace shardcache::upstream
