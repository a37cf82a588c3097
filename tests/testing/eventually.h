// Eventually: polls a condition until it holds or a timeout passes (for effects another thread
// or process produces).
#pragma once

#include <chrono>
#include <thread>

namespace shardcache::testing {

// True as soon as p() is; p()'s last answer once `timeout` has passed.
template <typename Pred>
bool Eventually(Pred p, std::chrono::milliseconds timeout = std::chrono::seconds(20),
                std::chrono::milliseconds poll = std::chrono::milliseconds(5)) {
  const auto end = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < end) {
    if (p()) return true;
    std::this_thread::sleep_for(poll);
  }
  return p();
}

}  // namespace shardcache::testing
