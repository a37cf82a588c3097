#include "objstore/curl_driver.h"
#include "common/thread_name.h"

#include <algorithm>
#include <mutex>

#include <spdlog/spdlog.h>

namespace shardcache::objstore {

void CurlGlobalInit() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

Result<std::unique_ptr<CurlDriver>> CurlDriver::Start(uint32_t max_transfers) {
  CurlGlobalInit();
  CURLM* multi = curl_multi_init();
  if (!multi) return Internal("curl_multi_init failed");
  max_transfers = std::max<uint32_t>(1, max_transfers);
  // The transfer cap is ours (StartDue), so a queued request's timeout does not run while it
  // waits; the pool keeps as many idle connections as may run at once.
  curl_multi_setopt(multi, CURLMOPT_MAXCONNECTS, static_cast<long>(max_transfers));
  curl_multi_setopt(multi, CURLMOPT_MAX_TOTAL_CONNECTIONS, static_cast<long>(max_transfers));
  std::unique_ptr<CurlDriver> d(new CurlDriver(multi, max_transfers));
  d->thread_ = std::thread([p = d.get()] {
    NameThisThread("sc-objstore");
    p->Loop();
  });
  return d;
}

void CurlDriver::Stop() {
  {
    // Under mu_, so that a Submit either queues before the flag (and AbortAll finishes it) or
    // sees it and refuses.
    MutexLock l(&mu_);
    stop_.store(true, std::memory_order_release);
  }
  curl_multi_wakeup(multi_);
  std::call_once(joined_, [this] {
    if (thread_.joinable()) thread_.join();
  });
}

CurlDriver::~CurlDriver() {
  Stop();
  curl_multi_cleanup(multi_);
}

bool CurlDriver::Submit(std::shared_ptr<Transfer> t, Clock::time_point not_before, bool urgent) {
  {
    MutexLock l(&mu_);
    if (stopping()) return false;
    // Kept sorted by not_before; equal times stay in submission order.
    std::deque<Waiting>& q = urgent ? urgent_ : waiting_;
    auto it = std::upper_bound(q.begin(), q.end(), not_before,
                               [](Clock::time_point tp, const Waiting& w) { return tp < w.not_before; });
    q.insert(it, Waiting{not_before, std::move(t)});
  }
  curl_multi_wakeup(multi_);
  return true;
}

CurlDriver::Clock::time_point CurlDriver::StartDue() {
  const Clock::time_point now = Clock::now();
  std::vector<std::shared_ptr<Transfer>> due;
  Clock::time_point next = Clock::time_point::max();
  {
    MutexLock l(&mu_);
    for (std::deque<Waiting>* q : {&urgent_, &waiting_}) {
      while (!q->empty() && running_.size() + due.size() < max_transfers_) {
        if (q->front().not_before > now) break;
        due.push_back(std::move(q->front().transfer));
        q->pop_front();
      }
      if (!q->empty() && q->front().not_before > now) next = std::min(next, q->front().not_before);
    }
  }
  for (auto& t : due) {
    CURL* easy = t->Begin();
    if (!easy || curl_multi_add_handle(multi_, easy) != CURLM_OK) {
      t->Finish(CURLE_FAILED_INIT);
      continue;
    }
    running_.emplace(easy, std::move(t));
  }
  return next;
}

size_t CurlDriver::ReapDone() {
  size_t reaped = 0;
  int left = 0;
  while (CURLMsg* msg = curl_multi_info_read(multi_, &left)) {
    if (msg->msg != CURLMSG_DONE) continue;
    CURL* easy = msg->easy_handle;
    const CURLcode result = msg->data.result;
    curl_multi_remove_handle(multi_, easy);
    auto it = running_.find(easy);
    if (it == running_.end()) continue;
    std::shared_ptr<Transfer> t = std::move(it->second);
    running_.erase(it);
    t->Finish(result);
    ++reaped;
  }
  return reaped;
}

void CurlDriver::AbortAll() {
  for (auto& [easy, t] : running_) {
    curl_multi_remove_handle(multi_, easy);
    t->Finish(CURLE_ABORTED_BY_CALLBACK);
  }
  running_.clear();
  std::deque<Waiting> waiting;
  {
    MutexLock l(&mu_);
    waiting.swap(urgent_);
    waiting.insert(waiting.end(), std::make_move_iterator(waiting_.begin()), std::make_move_iterator(waiting_.end()));
    waiting_.clear();
  }
  for (auto& w : waiting) w.transfer->Finish(CURLE_ABORTED_BY_CALLBACK);
}

void CurlDriver::Loop() {
  while (!stopping()) {
    const Clock::time_point next = StartDue();
    int still_running = 0;
    const CURLMcode mc = curl_multi_perform(multi_, &still_running);
    if (mc != CURLM_OK) spdlog::warn("objstore: curl_multi_perform: {}", curl_multi_strerror(mc));
    // A finished transfer frees a slot: start what waits for it before sleeping.
    if (ReapDone() > 0) continue;
    // Sleep until a socket is ready, a Submit wakes us, or the next backoff is due (curl
    // shortens the wait itself for its own timers).
    int timeout_ms = 1000;
    if (next != Clock::time_point::max()) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(next - Clock::now()).count();
      timeout_ms = static_cast<int>(std::clamp<int64_t>(left + 1, 0, 1000));
    }
    curl_multi_poll(multi_, nullptr, 0, timeout_ms, nullptr);
  }
  AbortAll();
}

}  // namespace shardcache::objstore
