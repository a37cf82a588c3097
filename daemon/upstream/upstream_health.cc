#include "daemon/upstream/upstream_health.h"

#include <algorithm>
#include <cmath>

#include <spdlog/spdlog.h>

namespace shardcache::upstream {
namespace {

int64_t ToNs(UpstreamHealth::Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}
UpstreamHealth::Clock::time_point FromNs(int64_t ns) {
  return UpstreamHealth::Clock::time_point(std::chrono::nanoseconds(ns));
}
std::string Seconds(double s) { return std::to_string(static_cast<int64_t>(std::lround(s))) + " s"; }

}  // namespace

bool ProbeAnswered(const Status& s) {
  switch (s.code()) {
    case StatusCode::kUnavailable:
    case StatusCode::kDeadlineExceeded:
    case StatusCode::kCancelled:
    case StatusCode::kUnknown:
    case StatusCode::kInternal:
    case StatusCode::kUnauthenticated:
    case StatusCode::kPermissionDenied:
      return false;
    default:
      return true;
  }
}

UpstreamHealth::UpstreamHealth(std::string where, std::chrono::milliseconds outage_timeout, bool report)
    : where_(std::move(where)),
      outage_timeout_(outage_timeout),
      up_gauge_(report ? metrics::Registry::Global().GetGauge(
                             "shardcache_upstream_up",
                             "1 while the upstream answers; 0 before its first answer and while it is unreachable")
                       : &unreported_up_) {
  up_gauge_->Set(0);
}

void UpstreamHealth::SetUpLocked(bool up) {
  up_.store(up, std::memory_order_release);
  up_gauge_->Set(up ? 1 : 0);
}

void UpstreamHealth::OnAnswer() {
  const auto now = Clock::now();
  last_answer_ns_.store(ToNs(now), std::memory_order_relaxed);
  if (!in_outage_.load(std::memory_order_acquire) && up_.load(std::memory_order_acquire)) return;
  MutexLock lock(&mu_);
  if (declared_down_) {
    spdlog::warn("{} answers again after {} without an answer", where_,
                 Seconds(std::chrono::duration<double>(now - outage_start_).count()));
  }
  in_outage_.store(false, std::memory_order_release);
  last_error_.clear();
  warned_ = false;
  declared_down_ = false;
  unprobed_failure_ = false;
  SetUpLocked(true);
}

bool UpstreamHealth::OnFailure(const Status& error, Clock::time_point last_heard) {
  const auto now = Clock::now();
  MutexLock lock(&mu_);
  // Silent since the later of: what this attempt last heard, what anything last heard.
  const auto silent_since = std::max(last_heard, FromNs(last_answer_ns_.load(std::memory_order_relaxed)));
  if (!in_outage_.load(std::memory_order_relaxed)) {
    outage_start_ = silent_since;
    in_outage_.store(true, std::memory_order_release);
  }
  last_error_ = error.ToString();
  unprobed_failure_ = true;
  if (!warned_) {
    warned_ = true;
    spdlog::warn("{}: {}; retrying (each retry is logged at debug level)", where_, last_error_);
  }
  return now - outage_start_ >= outage_timeout_;
}

void UpstreamHealth::OnProbe(const Status& result, Clock::time_point started) {
  if (ProbeAnswered(result)) {
    OnAnswer();
    return;
  }
  MutexLock lock(&mu_);
  unprobed_failure_ = false;
  if (!in_outage_.load(std::memory_order_relaxed)) {
    // Silent since its last answer (probes keep that recent while it is idle); before any
    // answer, since the first probe went out (start-up).
    const int64_t last = last_answer_ns_.load(std::memory_order_relaxed);
    outage_start_ = last != 0 ? FromNs(last) : started;
    in_outage_.store(true, std::memory_order_release);
  }
  last_error_ = result.ToString();
  if (!declared_down_) {
    declared_down_ = true;
    spdlog::error("{} is unreachable: {}; cached chunks are still served, reads of anything else fail with "
                  "Unavailable after {} without an answer (fetch.outage_timeout)",
                  where_, last_error_, Seconds(std::chrono::duration<double>(outage_timeout_).count()));
  }
  SetUpLocked(false);
}

UpstreamHealth::Clock::time_point UpstreamHealth::GiveUpAt() const {
  if (!in_outage_.load(std::memory_order_acquire)) return Clock::time_point::max();
  MutexLock lock(&mu_);
  if (!in_outage_.load(std::memory_order_relaxed)) return Clock::time_point::max();
  return outage_start_ + outage_timeout_;
}

Status UpstreamHealth::OutageError() const {
  MutexLock lock(&mu_);
  const double silent = in_outage_.load(std::memory_order_relaxed)
                            ? std::chrono::duration<double>(Clock::now() - outage_start_).count()
                            : 0;
  return Unavailable(where_ + " has not answered for " + Seconds(silent) + " (fetch.outage_timeout " +
                     Seconds(std::chrono::duration<double>(outage_timeout_).count()) +
                     "); last error: " + (last_error_.empty() ? std::string("none") : last_error_));
}

bool UpstreamHealth::ProbeDue(std::chrono::milliseconds quiet) const {
  {
    MutexLock lock(&mu_);
    if (unprobed_failure_) return true;
  }
  const int64_t last = last_answer_ns_.load(std::memory_order_relaxed);
  return last == 0 || Clock::now() - FromNs(last) >= quiet;
}

UpstreamHealth::Snapshot UpstreamHealth::Get() const {
  Snapshot s;
  MutexLock lock(&mu_);
  s.up = up_.load(std::memory_order_relaxed);
  if (in_outage_.load(std::memory_order_relaxed)) {
    s.down_seconds = std::chrono::duration<double>(Clock::now() - outage_start_).count();
    s.last_error = last_error_;
  }
  return s;
}

}  // namespace shardcache::upstream
