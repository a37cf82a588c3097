// StreamController: how many upstream streams (one per HTTP/2 connection) to run at once.
//
// A long link is filled only by enough parallel streams (each tops out at window / RTT), but
// streams past that point only add overhead. The controller hill-climbs on measured capacity:
// every measuring period, if work was waiting for a stream slot (demand exceeds the current
// limit), it compares this period's capacity with the period before the last change —
//   * after a raise, capacity grew by >= `gain` → keep it and raise again;
//   * after a raise, capacity did not grow      → go back to the count before the raise and
//                                                 hold for `hold_periods`;
//   * otherwise (settled, not holding)          → probe a raise.
// Raises start multiplicative (slow start: doubling, as a cross-city link may need tens or
// hundreds of streams and one stream more per period would take minutes) and become +1/8 once a
// doubling from the same count did not help twice (the first failure is re-measured: see
// Decide). Without waiting work nothing changes: an idle or lightly
// used source does not grow.
//
// Capacity is measured per chunk, not by counting arrivals: each chunk reports its bytes, the
// time its stream took to bring it and how many streams ran, and capacity = (bytes /
// stream-seconds over the period's chunks) x (mean streams running). Counting arrivals is noise on a slow link — streams started
// together finish together (a burst every 9.6 s at 64 KiB / 150 ms), so a period holds one
// burst or two — while each chunk's own rate is exact. A period starts one chunk time after a
// change (chunks requested before it are not measured), lasts at least `period` and until
// `min_period_chunks` chunks (at most the limit) and half the limit reported, capped at `max_period`. Without
// chunk reports (chunk_time 0) capacity is the bytes counted over the period.
//
// Slow start's doublings are judged by the bytes counted over the period instead (the caller
// counts them as they arrive, message by message): on a link whose connections stall now and
// then, the chunks that report first in a period are the fast ones, so the per-chunk measure
// overrated the count before a doubling (traced: 368 MB/s "capacity" at 97 MB/s goodput) and
// judged the doubling a failure twice, which left the pool at 32 streams for the whole epoch
// (0.41-0.44 x link in those runs). A doubling expects far more than the measuring noise, and
// the bytes the link carried are what it should gain.
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
  int min_period_chunks = 16;
  std::chrono::milliseconds max_period{20000};
  double gain = 1.05;    // a raise must improve capacity by this factor to be kept
  int hold_periods = 10; // after an unhelpful raise, wait this long before probing again
};

class StreamController {
 public:
  using Clock = std::chrono::steady_clock;
  explicit StreamController(StreamControllerOptions options, Clock::time_point now = Clock::now());

  int limit() const;
  // Latest period's goodput in bytes/s, counted (0 before the first full period).
  double goodput() const;

  // `total_bytes`: cumulative bytes received (counted per message); `saturated`: some work waited for a
  // slot since the previous call; `chunk_bytes` / `chunk_time`: the chunk that just arrived and
  // how long its stream took to bring it (0: no chunk), `running`: streams running as it
  // arrived. Cheap; call it whenever a chunk lands.
  void Observe(Clock::time_point now, uint64_t total_bytes, bool saturated, uint64_t chunk_bytes = 0,
               std::chrono::nanoseconds chunk_time = std::chrono::nanoseconds(0), int running = 0);
  // The upstream refused a stream while `running` streams ran: the limit (and from now on the
  // ceiling) becomes min(running - 1, 3/4 of the limit), at least `min`.
  void Refused(int running);

 private:
  // Chunk reports a period needs before it is judged.
  int PeriodChunks() const REQUIRES(mu_);
  // The limit a probe raises to.
  int NextProbe() const REQUIRES(mu_);
  // Starts a new period at `now` (nothing measured yet).
  void Restart(Clock::time_point now, uint64_t total_bytes) REQUIRES(mu_);
  // Acts on a finished period's capacity; `settle`: how long the next period waits after a change.
  void Decide(Clock::time_point now, double capacity, bool saturated, Clock::duration settle) REQUIRES(mu_);

  const StreamControllerOptions options_;
  mutable Mutex mu_;
  int limit_ GUARDED_BY(mu_);
  int ceiling_ GUARDED_BY(mu_);  // options_.max, lowered by Refused()
  Clock::time_point period_start_ GUARDED_BY(mu_);
  Clock::time_point settle_until_ GUARDED_BY(mu_);  // no measuring before (after a change)
  uint64_t period_bytes_ GUARDED_BY(mu_) = 0;  // total_bytes at period start
  bool period_saturated_ GUARDED_BY(mu_) = false;
  // This period's chunk reports: count, bytes, stream-seconds.
  int period_chunks_ GUARDED_BY(mu_) = 0;
  double chunk_bytes_ GUARDED_BY(mu_) = 0;
  double chunk_seconds_ GUARDED_BY(mu_) = 0;
  double running_sum_ GUARDED_BY(mu_) = 0;  // streams running, summed over the reports
  double chunk_time_s_ GUARDED_BY(mu_) = 0;  // moving average of one chunk's stream time
  bool probing_ GUARDED_BY(mu_) = false;    // the last change was a raise
  bool slow_start_ GUARDED_BY(mu_) = true;  // raises are still multiplicative
  int previous_limit_ GUARDED_BY(mu_) = 0;  // the limit before the last raise
  int failed_doubling_from_ GUARDED_BY(mu_) = 0;  // the count a slow-start doubling failed from
  int hold_ GUARDED_BY(mu_) = 0;
  double base_capacity_ GUARDED_BY(mu_) = 0;  // capacity before the last raise
  double goodput_ GUARDED_BY(mu_) = 0;
};

}  // namespace shardcache::upstream
