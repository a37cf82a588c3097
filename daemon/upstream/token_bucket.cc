#include "daemon/upstream/token_bucket.h"

#include <algorithm>
#include <thread>

namespace shardcache::upstream {

TokenBucket::TokenBucket(uint64_t rate_bytes_per_s, double burst_seconds)
    : burst_seconds_(burst_seconds),
      rate_(rate_bytes_per_s),
      balance_(static_cast<double>(rate_bytes_per_s) * burst_seconds),
      last_(Clock::now()) {}

void TokenBucket::SetRate(uint64_t rate_bytes_per_s) {
  MutexLock lock(&mu_);
  RefillLocked(Clock::now());
  rate_ = rate_bytes_per_s;
  balance_ = std::min(balance_, static_cast<double>(rate_) * burst_seconds_);
}

uint64_t TokenBucket::rate() const {
  MutexLock lock(&mu_);
  return rate_;
}

void TokenBucket::RefillLocked(Clock::time_point now) {
  const double dt = std::chrono::duration<double>(now - last_).count();
  last_ = now;
  const double cap = static_cast<double>(rate_) * burst_seconds_;
  balance_ = std::min(cap, balance_ + dt * static_cast<double>(rate_));
}

Status TokenBucket::Take(uint64_t bytes, Clock::time_point deadline) {
  Clock::time_point until;
  {
    MutexLock lock(&mu_);
    if (rate_ == 0) return Status::Ok();
    const auto now = Clock::now();
    RefillLocked(now);
    balance_ -= static_cast<double>(bytes);
    if (balance_ >= 0) return Status::Ok();
    until = now + std::chrono::duration_cast<Clock::duration>(
                      std::chrono::duration<double>(-balance_ / static_cast<double>(rate_)));
  }
  if (until > deadline) {
    std::this_thread::sleep_until(deadline);
    return DeadlineExceeded("bandwidth cap: the deadline passed while waiting for link budget");
  }
  std::this_thread::sleep_until(until);
  return Status::Ok();
}

}  // namespace shardcache::upstream
