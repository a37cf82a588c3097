#include "daemon/upstream/stream_controller.h"

#include <algorithm>

namespace shardcache::upstream {

StreamController::StreamController(StreamControllerOptions options, Clock::time_point now)
    : options_(options),
      limit_(std::clamp(options.initial, options.min, std::max(options.min, options.max))),
      ceiling_(std::max(options.min, options.max)),
      period_start_(now),
      settle_until_(now) {}

int StreamController::limit() const {
  MutexLock lock(&mu_);
  return limit_;
}

double StreamController::goodput() const {
  MutexLock lock(&mu_);
  return goodput_;
}

void StreamController::Restart(Clock::time_point now, uint64_t total_bytes) {
  period_start_ = now;
  period_bytes_ = total_bytes;
  period_chunks_ = 0;
  chunk_bytes_ = 0;
  chunk_seconds_ = 0;
  running_sum_ = 0;
}

void StreamController::Observe(Clock::time_point now, uint64_t total_bytes, bool saturated, uint64_t chunk_bytes,
                               std::chrono::nanoseconds chunk_time, int running) {
  MutexLock lock(&mu_);
  period_saturated_ = period_saturated_ || saturated;
  const double seconds_per_chunk = std::chrono::duration<double>(chunk_time).count();
  if (seconds_per_chunk > 0) {
    chunk_time_s_ = chunk_time_s_ == 0 ? seconds_per_chunk : chunk_time_s_ + (seconds_per_chunk - chunk_time_s_) / 8;
  }
  if (now < settle_until_) {
    // Right after a change, chunks requested before it are still arriving: not measured.
    Restart(now, total_bytes);
    return;
  }
  if (seconds_per_chunk > 0) {
    ++period_chunks_;
    chunk_bytes_ += static_cast<double>(chunk_bytes);
    chunk_seconds_ += seconds_per_chunk;
    running_sum_ += running > 0 ? running : limit_;
  }
  if (total_bytes == period_bytes_ && period_chunks_ == 0) return;  // nothing to judge by yet
  const auto elapsed = now - period_start_;
  if (elapsed < options_.max_period) {
    if (elapsed < options_.period) return;
    if (chunk_time_s_ > 0 && period_chunks_ < PeriodChunks()) return;
  }
  goodput_ = static_cast<double>(total_bytes - period_bytes_) / std::chrono::duration<double>(elapsed).count();
  const double capacity =
      chunk_seconds_ > 0 && !slow_start_ ? chunk_bytes_ / chunk_seconds_ * (running_sum_ / period_chunks_) : goodput_;
  const bool was_saturated = period_saturated_;
  period_saturated_ = false;
  Restart(now, total_bytes);
  // The next period starts measuring once one chunk time has passed after a change.
  const auto settle = std::min<Clock::duration>(
      std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(chunk_time_s_)), options_.max_period);
  Decide(now, capacity, was_saturated, settle);
}

void StreamController::Decide(Clock::time_point now, double capacity, bool saturated, Clock::duration settle) {
  if (!saturated) {
    probing_ = false;
    base_capacity_ = capacity;
    return;
  }
  if (probing_) {
    if (capacity >= base_capacity_ * options_.gain) {
      // The raise paid off: keep it and probe further.
      base_capacity_ = capacity;
      if (limit_ < ceiling_) {
        previous_limit_ = limit_;
        limit_ = NextProbe();
        settle_until_ = now + settle;
      } else {
        probing_ = false;
      }
    } else if (slow_start_ && failed_doubling_from_ != previous_limit_) {
      // A doubling that did not help once may have been judged against a base measured too
      // early (in the first seconds only the fast chunks have arrived: a link whose streams
      // stall now and then looks several times faster than it is). Back to the last count,
      // measure it afresh, and double again; only a second failure from the same count ends
      // slow start.
      failed_doubling_from_ = previous_limit_;
      limit_ = std::max(options_.min, previous_limit_);
      settle_until_ = now + settle;
      probing_ = false;
    } else {
      // It did not: back to the last good count; from now on probe one stream at a time.
      limit_ = std::max(options_.min, previous_limit_);
      settle_until_ = now + settle;
      probing_ = false;
      slow_start_ = false;
      hold_ = options_.hold_periods;
      base_capacity_ = capacity;
    }
    return;
  }
  base_capacity_ = capacity;
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

int StreamController::PeriodChunks() const {
  // Half the streams at least: chunk times are heavy-tailed on a link that stalls, and a
  // handful of the fast ones first judged a raise by luck.
  return std::max(std::min(limit_, options_.min_period_chunks), limit_ / 2);
}

int StreamController::NextProbe() const {
  // Slow start: doubling (8 → 16 → 32 → 64 → 128 → 256), so a long link needing many streams
  // is filled within a few periods; each step's expected gain dwarfs the measuring noise.
  // After slow start: an eighth more (one stream at least). One stream more at 32 could gain
  // at most 3%, under the `gain` a raise must show, so +1 probes would never be kept there.
  const int step = slow_start_ ? limit_ : std::max(1, limit_ / 8);
  return std::min(ceiling_, limit_ + step);
}

}  // namespace shardcache::upstream
