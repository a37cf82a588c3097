#include "daemon/upstream/stream_controller.h"

#include <algorithm>

namespace shardcache::upstream {

StreamController::StreamController(StreamControllerOptions options, Clock::time_point now)
    : options_(options),
      limit_(std::clamp(options.initial, options.min, std::max(options.min, options.max))),
      period_start_(now) {}

int StreamController::limit() const {
  MutexLock lock(&mu_);
  return limit_;
}

double StreamController::goodput() const {
  MutexLock lock(&mu_);
  return goodput_;
}

void StreamController::Observe(Clock::time_point now, uint64_t total_bytes, bool saturated) {
  MutexLock lock(&mu_);
  period_saturated_ = period_saturated_ || saturated;
  const auto elapsed = now - period_start_;
  if (elapsed < options_.period) return;
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
      if (limit_ < options_.max) {
        previous_limit_ = limit_;
        limit_ = NextProbe();
      } else {
        probing_ = false;
      }
    } else {
      // It did not: back to the last good count; from now on probe one stream at a time.
      limit_ = std::max(options_.min, previous_limit_);
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
  if (limit_ < options_.max) {
    previous_limit_ = limit_;
    limit_ = NextProbe();
    probing_ = true;
  }
}

int StreamController::NextProbe() const {
  // Slow start: +50% per step (4 → 6 → 9 → 13 → ...), so a long link needing many streams is
  // filled within a few periods; each step's expected gain dwarfs the measuring noise of whole
  // chunks per period. After the first step that did not help: one stream at a time.
  const int step = slow_start_ ? std::max(1, limit_ / 2) : 1;
  return std::min(options_.max, limit_ + step);
}

}  // namespace shardcache::upstream
