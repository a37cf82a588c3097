// TokenBucket: the global upstream bandwidth cap, shared by every stream of a GrpcSource.
//
// Tokens are bytes, refilled at `rate` bytes/s up to a burst of `burst_seconds` of rate. A
// stream takes the bytes of each message it received; when that drives the balance negative
// the stream sleeps until the debt is repaid, so the next read (and, through HTTP/2 flow
// control, the sender) slows down. Debt rather than "wait for enough tokens" means a message
// larger than the burst still passes, and the long-run rate stays exact.
//
// Thread safety: all methods are thread-safe. SetRate applies at once (SIGHUP reload).
#pragma once

#include <chrono>
#include <cstdint>

#include "common/mutex.h"
#include "common/status.h"

namespace shardcache::upstream {

class TokenBucket {
 public:
  using Clock = std::chrono::steady_clock;

  // rate_bytes_per_s == 0: unlimited.
  explicit TokenBucket(uint64_t rate_bytes_per_s, double burst_seconds = 0.05);

  void SetRate(uint64_t rate_bytes_per_s);
  uint64_t rate() const;

  // Takes `bytes`; sleeps while the bucket is in debt. DeadlineExceeded when repaying the debt
  // would outlast `deadline` (the bytes stay taken: they did cross the link).
  Status Take(uint64_t bytes, Clock::time_point deadline);

 private:
  void RefillLocked(Clock::time_point now) REQUIRES(mu_);

  const double burst_seconds_;
  mutable Mutex mu_;
  uint64_t rate_ GUARDED_BY(mu_);
  double balance_ GUARDED_BY(mu_);  // bytes; negative = debt
  Clock::time_point last_ GUARDED_BY(mu_);
};

}  // namespace shardcache::upstream
