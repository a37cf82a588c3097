// UpstreamHealth: whether a grpc upstream answers, since when it does not, and why — the state
// behind shardcache_upstream_up, the "upstream" check of /ready and /status, and the bound on
// how long reads keep retrying an upstream that stopped answering (fetch.outage_timeout).
//
// Evidence comes from two places: every attempt of a real call (a stream message or a unary
// answer is an answer; a transport failure is a failure), and a probe the source runs while no
// call has answered for a while (GrpcSource: every 5 s, every second while down, at once after
// a failure).
//
//   * An outage starts at the first failure after the last answer — at the moment that attempt
//     last heard from the upstream, so a stream that went silent counts from its last byte —
//     and ends with the next answer.
//   * Down: a probe failed during an outage. Only then is the upstream reported unreachable
//     (up() false, the gauge 0, /ready 503); a single reset that the next retry gets past is
//     not an outage anyone needs to hear about. Before the first answer (a daemon just
//     started) the upstream is not up either, without an error logged.
//   * Give-up time: outage start + outage_timeout. A read whose attempt fails after it, or that
//     starts after it, fails with Unavailable naming the upstream, how long it has been silent
//     and the last error (OutageError); so a trainer waits at most about outage_timeout after
//     the upstream stopped answering, and not at all while a known outage goes on.
//
// Logging, once per change: a warning at the first failure of an outage (the retries that
// follow are debug lines), an error when it is declared down, a warning when it answers again.
//
// Thread safety: all methods are safe from any thread; OnAnswer is lock-free while there is no
// outage (it runs for every message).
#pragma once

#include <atomic>
#include <chrono>
#include <string>

#include "common/metrics.h"
#include "common/mutex.h"
#include "common/status.h"

namespace shardcache::upstream {

class UpstreamHealth {
 public:
  using Clock = std::chrono::steady_clock;

  // `where` names the upstream in messages ("upstream origin:7443").
  // `report`: drives the shardcache_upstream_up gauge (false: a peer group member's health).
  UpstreamHealth(std::string where, std::chrono::milliseconds outage_timeout, bool report = true);

  // The upstream answered (a message, a unary reply, a status that is not a transport failure).
  void OnAnswer();
  // An attempt failed with a transport error; `last_heard` is when that attempt last received
  // something (its start if nothing). True when the outage has lasted outage_timeout: the
  // caller gives up with OutageError().
  bool OnFailure(const Status& error, Clock::time_point last_heard);
  // A probe's outcome (ProbeAnswered decides what counts as an answer); `started`: when it
  // was sent.
  void OnProbe(const Status& result, Clock::time_point started);

  // When reads stop retrying: outage start + outage_timeout; Clock::time_point::max() while
  // there is no outage.
  Clock::time_point GiveUpAt() const;
  // Unavailable naming the upstream, how long it has not answered, the bound and the last error.
  Status OutageError() const;
  // Whether a probe should run now: no answer within `quiet`, or a failure not yet probed.
  bool ProbeDue(std::chrono::milliseconds quiet) const;

  struct Snapshot {
    bool up = false;
    double down_seconds = 0;   // length of the current outage; 0 when none
    std::string last_error;    // of the current outage; "" when none (also before any answer)
  };
  Snapshot Get() const;
  bool up() const { return up_.load(std::memory_order_acquire); }

 private:
  void SetUpLocked(bool up) REQUIRES(mu_);

  const std::string where_;
  const std::chrono::milliseconds outage_timeout_;
  metrics::Gauge unreported_up_;
  metrics::Gauge* const up_gauge_;

  mutable Mutex mu_;
  std::atomic<bool> in_outage_{false};      // mirrors outage_start_ being set, for OnAnswer
  std::atomic<bool> up_{false};
  std::atomic<int64_t> last_answer_ns_{0};  // steady clock; 0 = never
  Clock::time_point outage_start_ GUARDED_BY(mu_);  // valid while in_outage_
  std::string last_error_ GUARDED_BY(mu_);
  bool warned_ GUARDED_BY(mu_) = false;            // this outage's warning was logged
  bool declared_down_ GUARDED_BY(mu_) = false;     // a probe failed in this outage
  bool unprobed_failure_ GUARDED_BY(mu_) = false;  // a failure since the last probe
};

// Whether a probe's status means the upstream is there and serves this daemon: any answer but
// a transport failure or a refusal of our credentials (Unauthenticated, PermissionDenied).
bool ProbeAnswered(const Status& s);

}  // namespace shardcache::upstream
