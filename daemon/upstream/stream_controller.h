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
// Raises start multiplicative (slow start: doubling per step, as a cross-city link may need tens
// or hundreds of streams and one stream more per period would take minutes) and become +1
// after the first raise that did not help. Without waiting work nothing changes: an idle or
// lightly used source does not grow.
//
// A period starts one chunk time after a change (a raise shows in goodput only once chunks
// requested after it arrive; what arrives before is not measured) and lasts at least `period`,
// at least the time one stream takes to bring one chunk, and until `min_period_bytes` arrived —
// all capped at `max_period`. Goodput is seen in whole chunks, and
// on a slow link (64 KiB / 150 ms: 9.6 s per 4 MiB chunk per stream) a 400 ms period holds
// zero or one of them, which would make every comparison noise.
//
// When the upstream refuses a stream for want of capacity (RESOURCE_EXHAUSTED: its per-client
// call cap), Refused() lowers the limit below the count that was running and by a quarter at
// least, and keeps it as the ceiling from then on.
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
  uint64_t min_period_bytes = 16ull << 20;
  std::chrono::milliseconds max_period{20000};
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
  // slot since the previous call; `chunk_time`: how long one stream currently takes per chunk
  // (zero when unknown). Cheap; call it whenever a stream finishes or a chunk lands.
  void Observe(Clock::time_point now, uint64_t total_bytes, bool saturated,
               std::chrono::nanoseconds chunk_time = std::chrono::nanoseconds(0));
  // The upstream refused a stream while `running` streams ran: the limit (and from now on the
  // ceiling) becomes min(running - 1, 3/4 of the limit), at least `min`.
  void Refused(int running);

 private:
  // The limit a probe raises to.
  int NextProbe() const REQUIRES(mu_);

  const StreamControllerOptions options_;
  mutable Mutex mu_;
  int limit_ GUARDED_BY(mu_);
  int ceiling_ GUARDED_BY(mu_);  // options_.max, lowered by Refused()
  Clock::time_point period_start_ GUARDED_BY(mu_);
  Clock::time_point settle_until_ GUARDED_BY(mu_);  // no measuring before (after a change)
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
