// MessageTimes: the median of the last kWindow times one kind of message (a block range, a part
// of a whole chunk) took on its stream — the "usual time" a stuck fetch is judged against.
//
// A median and not a moving average: on a link whose connections stall now and then (seconds
// without a byte), a few stalled messages pull an average up towards the stall length, and a
// fetch would count as stuck only after several stalls' worth of time — exactly when a hedge
// matters. The median moves only when most messages slow down (more streams share the link),
// which is what "usual" should follow.
//
// The lower of two medians: of the last kWindow messages and of the last kLongWindow. At an
// epoch's tail, when the fast messages are done and mostly stalled ones still arrive, the short
// median became the stall length (2 s, traced) and nothing stuck was hedged any more; the long
// one still holds the usual time there (a tail brings few messages). After a real, lasting
// slowdown both follow, the long one within kLongWindow / 2 messages (about a second at 1 Gbit).
//
// Thread safety: Add and Median from any thread.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>

#include "common/mutex.h"

namespace shardcache::upstream {

class MessageTimes {
 public:
  static constexpr size_t kWindow = 31;
  static constexpr size_t kLongWindow = 255;

  void Add(int64_t ns) {
    MutexLock l(&mu_);
    times_[next_ % kLongWindow] = ns;
    ++next_;
  }

  // 0 before the first Add.
  int64_t Median() const {
    std::array<int64_t, kLongWindow> copy;
    size_t n;
    {
      MutexLock l(&mu_);
      n = std::min<size_t>(next_, kLongWindow);
      // The latest n, newest first.
      for (size_t i = 0; i < n; ++i) copy[i] = times_[(next_ - 1 - i) % kLongWindow];
    }
    if (n == 0) return 0;
    const size_t s = std::min(n, kWindow);
    std::array<int64_t, kWindow> recent;
    std::copy_n(copy.begin(), s, recent.begin());
    std::nth_element(recent.begin(), recent.begin() + s / 2, recent.begin() + s);
    std::nth_element(copy.begin(), copy.begin() + n / 2, copy.begin() + n);
    return std::min(recent[s / 2], copy[n / 2]);
  }

 private:
  mutable Mutex mu_;
  std::array<int64_t, kLongWindow> times_ GUARDED_BY(mu_){};
  size_t next_ GUARDED_BY(mu_) = 0;
};

}  // namespace shardcache::upstream
