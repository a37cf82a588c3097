// CurlDriver: one thread running many HTTP transfers at once with libcurl's multi interface
// (curl_multi_poll), so hundreds of ranged GETs need one thread, not one each.
//
// A Transfer is one request attempt's owner: the driver calls Begin() on its thread to get a
// configured easy handle, runs it, and calls Finish() with curl's result once it is done. At most
// `max_transfers` run at once; the rest wait in submission order (a retry may ask to wait until
// a time, for backoff). Connections are kept in the multi handle's pool and reused by later
// transfers to the same host; the pool holds at most `max_transfers` connections.
//
// Begin and Finish run on the driver thread and must not block. Finish may Submit again (a
// retry). When the driver stops (Stop or the destructor) every queued or running transfer gets
// Finish with CURLE_ABORTED_BY_CALLBACK and stopping() is true; Submit then returns false and
// does nothing.
//
// Thread safety: Submit may be called from any thread, including from Begin/Finish.
#pragma once

#include <curl/curl.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <memory>
#include <thread>
#include <vector>

#include "common/mutex.h"
#include "common/status.h"

namespace shardcache::objstore {

class Transfer {
 public:
  virtual ~Transfer() = default;
  // The easy handle to run (owned by the Transfer, valid until Finish returns); null fails the
  // attempt at once with Finish(CURLE_FAILED_INIT).
  virtual CURL* Begin() = 0;
  virtual void Finish(CURLcode result) = 0;
};

// curl_global_init once per process (thread-safe); every user of libcurl here calls it first.
void CurlGlobalInit();

class CurlDriver {
 public:
  using Clock = std::chrono::steady_clock;

  // Internal when curl's multi handle cannot be made.
  static Result<std::unique_ptr<CurlDriver>> Start(uint32_t max_transfers);
  ~CurlDriver();
  CurlDriver(const CurlDriver&) = delete;
  // Ends every transfer now (see above) and joins the thread. Idempotent. REQUIRES: not called
  // from Begin/Finish (the driver thread).
  void Stop();
  CurlDriver& operator=(const CurlDriver&) = delete;

  // Queues `t` to begin no earlier than `not_before`. An `urgent` transfer begins before every
  // other one that is due (a demand read a trainer waits for, queued behind warm reads). False
  // (and nothing queued) once stopping.
  bool Submit(std::shared_ptr<Transfer> t, Clock::time_point not_before = {}, bool urgent = false);
  bool stopping() const { return stop_.load(std::memory_order_acquire); }

 private:
  struct Waiting {
    Clock::time_point not_before;
    std::shared_ptr<Transfer> transfer;
  };
  CurlDriver(CURLM* multi, uint32_t max_transfers) : multi_(multi), max_transfers_(max_transfers) {}

  void Loop();
  // Starts due waiting transfers while fewer than max_transfers_ run; returns the earliest
  // not-yet-due time (or max()) for the poll timeout.
  Clock::time_point StartDue();
  // Finishes completed transfers; returns how many.
  size_t ReapDone();
  void AbortAll();

  CURLM* const multi_;
  const uint32_t max_transfers_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
  std::once_flag joined_;
  // Driver thread only: running transfers by easy handle.
  std::map<CURL*, std::shared_ptr<Transfer>> running_;

  Mutex mu_;
  // Not yet begun, each sorted by not_before: urgent_ first when due, then waiting_.
  std::deque<Waiting> urgent_ GUARDED_BY(mu_);
  std::deque<Waiting> waiting_ GUARDED_BY(mu_);
};

}  // namespace shardcache::objstore
