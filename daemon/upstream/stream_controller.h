// StreamController: how many upstream streams (one per HTTP/2 connection) to run at once.
//
// A long link is filled only by enough parallel streams (each tops out at window / RTT), but
// streams past that point only add overhead. The controller hill-climbs on measured goodput:
// every `period`, if work was waiting for a stream slot (demand exceeds the current limit),
// it compares this period's goodput with the period before the last change —
//   * after a raise, goodput grew by >= `gain` → keep it and raise again;
//   * after a raise, goodput did not grow      → go back to the count before the raise and hold
//                                                for `hold_periods`;
//   * otherwise (settled, not holding)         → probe a raise.
// Raises start multiplicative (slow start: +50% per step, as a cross-city link may need 16
// streams and one stream more per period would take seconds) and become +1 after the first raise
// that did not help. Without waiting work nothing changes: an idle or lightly used source does
// not grow.
//
// Thread safety: all methods are thread-safe.
#pragma once

#include <chrono>
#include <cstdint>

#include "common/mutex.h"

namespace shardcache::upstream {

struct StreamControllerOptions {
  int initial = 4;  // streams at start
  int min = 1;
  int max = 16;
  std::chrono::milliseconds period{400};
  double gain = 1.05;    // a raise must improve goodput by this factor to be kept
  int hold_periods = 10; // after an unhelpful raise, wait this long before probing again
};

class StreamController {
 public:
  using Clock = std::chrono::steady_clock;
  explicit StreamController(StreamControllerOptions options, Clock::time_point now = Clock::now());

  int limit() const;
  // Latest period's goodput in bytes/s (0 before the first full period).
  double goodput() const;

  // `total_bytes`: cumulative verified bytes delivered; `saturated`: some work waited for a
  // slot since the previous call. Cheap; call it whenever a stream finishes or a chunk lands.
  void Observe(Clock::time_point now, uint64_t total_bytes, bool saturated);

 private:
  // The limit a probe raises to.
  int NextProbe() const REQUIRES(mu_);

  const StreamControllerOptions options_;
  mutable Mutex mu_;
  int limit_ GUARDED_BY(mu_);
  Clock::time_point period_start_ GUARDED_BY(mu_);
  uint64_t period_bytes_ GUARDED_BY(mu_) = 0;  // total_bytes at period start
  bool period_saturated_ GUARDED_BY(mu_) = false;
  bool probing_ GUARDED_BY(mu_) = false;    // the last change was a raise
  bool slow_start_ GUARDED_BY(mu_) = true;  // raises are still multiplicative
  int previous_limit_ GUARDED_BY(mu_) = 0;  // the limit before the last raise
  int hold_ GUARDED_BY(mu_) = 0;
  double base_goodput_ GUARDED_BY(mu_) = 0;  // goodput before the last raise
  double goodput_ GUARDED_BY(mu_) = 0;
};

}  // namespace shardcache::upstream
