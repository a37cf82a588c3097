// RandomDelay: sleeps a random time below a bound, from a seeded generator, so test sources can
// make reads finish out of order reproducibly. Safe to call from several threads.
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <random>
#include <thread>

namespace shardcache::testing {

class RandomDelay {
 public:
  RandomDelay(uint32_t seed, uint32_t max_us) : rng_(seed), max_us_(max_us) {}

  // Sleeps 0 to max_us - 1 microseconds.
  void Sleep() {
    uint32_t us;
    {
      std::lock_guard<std::mutex> l(mu_);
      us = rng_() % max_us_;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(us));
  }

 private:
  std::mutex mu_;
  std::mt19937 rng_;
  const uint32_t max_us_;
};

}  // namespace shardcache::testing
