// MessageTimes: the median of the last kWindow times one kind of message (a block range, a part
// of a whole chunk) took on its stream — the "usual time" a stuck fetch is judged against.
//
// A median and not a moving average: on a link whose connections stall now and then (seconds
// without a byte), a few stalled messages pull an average up towards the stall length, and a
// fetch would count as stuck only after several stalls' worth of time — exactly when a hedge
// matters. The median moves only when most messages slow down (more streams share the link),
// which is what "usual" should follow.
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

  void Add(int64_t ns) {
    MutexLock l(&mu_);
    times_[next_ % kWindow] = ns;
    ++next_;
  }

  // 0 before the first Add.
  int64_t Median() const {
    std::array<int64_t, kWindow> copy;
    size_t n;
    {
      MutexLock l(&mu_);
      n = std::min<size_t>(next_, kWindow);
      std::copy_n(times_.begin(), n, copy.begin());
    }
    if (n == 0) return 0;
    std::nth_element(copy.begin(), copy.begin() + n / 2, copy.begin() + n);
    return copy[n / 2];
  }

 private:
  mutable Mutex mu_;
  std::array<int64_t, kWindow> times_ GUARDED_BY(mu_){};
  size_t next_ GUARDED_BY(mu_) = 0;
};

}  // namespace shardcache::upstream
