#include "daemon/upstream/stream_controller.h"

#include <algorithm>

namespace shardcache::upstream {

StreamController::StreamController(StreamControllerOptions options, Clock::time_point now)
    : options_(options),
      limit_(std::clamp(options.initial, options.min, std::max(options.min, options.max))),
      ceiling_(std::max(options.min, options.max)),
      period_start_(now) {}

int StreamController::limit() const {
  MutexLock lock(&mu_);
  return limit_;
}

double StreamController::goodput() const {
  MutexLock lock(&mu_);
  return goodput_;
}

void StreamController::Observe(Clock::time_point now, uint64_t total_bytes, bool saturated,
                               std::chrono::nanoseconds chunk_time) {
  MutexLock lock(&mu_);
  period_saturated_ = period_saturated_ || saturated;
  if (now < settle_until_) {
    // Right after a change, chunks requested before it are still arriving: not measured.
    period_start_ = now;
    period_bytes_ = total_bytes;
    return;
  }
  const auto elapsed = now - period_start_;
  if (elapsed < options_.max_period) {
    if (elapsed < options_.period || elapsed < chunk_time) return;
    if (total_bytes - period_bytes_ < options_.min_period_bytes) return;
  }
  // The next period starts measuring once one chunk time has passed after a change below.
  const auto settle = std::min<Clock::duration>(chunk_time, options_.max_period);
  const double seconds = std::chrono::duration<double>(elapsed).count();
  goodput_ = static_cast<double>(total_bytes - period_bytes_) / seconds;
  const bool was_saturated = period_saturated_;
  period_start_ = now;
  period_bytes_ = total_bytes;
  period_saturated_ = false;

  if (!was_saturated) {
    probing_ = false;
    base_goodput_ = goodput_;
    return;
  }
  if (probing_) {
    if (goodput_ >= base_goodput_ * options_.gain) {
      // The raise paid off: keep it and probe further.
      base_goodput_ = goodput_;
      if (limit_ < ceiling_) {
        previous_limit_ = limit_;
        limit_ = NextProbe();
        settle_until_ = now + settle;
      } else {
        probing_ = false;
      }
    } else {
      // It did not: back to the last good count; from now on probe one stream at a time.
      limit_ = std::max(options_.min, previous_limit_);
      settle_until_ = now + settle;
      probing_ = false;
      slow_start_ = false;
      hold_ = options_.hold_periods;
      base_goodput_ = goodput_;
    }
    return;
  }
  base_goodput_ = goodput_;
  if (hold_ > 0) {
    --hold_;
    return;
  }
  if (limit_ < ceiling_) {
    previous_limit_ = limit_;
    limit_ = NextProbe();
    settle_until_ = now + settle;
    probing_ = true;
  }
}

void StreamController::Refused(int running) {
  MutexLock lock(&mu_);
  // Below what ran, and by a quarter at least: several streams refused together each lower it.
  ceiling_ = std::clamp(std::min(running - 1, limit_ * 3 / 4), options_.min, ceiling_);
  limit_ = std::min(limit_, ceiling_);
  previous_limit_ = std::min(previous_limit_, ceiling_);
  probing_ = false;
}

int StreamController::NextProbe() const {
  // Slow start: doubling (8 → 16 → 32 → 64 → 128 → 256), so a long link needing many streams
  // is filled within a few periods; each step's expected gain dwarfs the measuring noise of whole
  // chunks per period. After the first step that did not help: one stream at a time.
  const int step = slow_start_ ? limit_ : 1;
  return std::min(ceiling_, limit_ + step);
}

}  // namespace shardcache::upstream
