// Deterministic shuffles: orders that are a pure function of a seed, the same on every machine,
// compiler and standard library (std::shuffle and std::uniform_int_distribution are not), so an
// order can be recomputed anywhere from its seed.
//
// Thread safety: a SplitMix64 is used by one thread; Shuffle is a pure function of its inputs.
#pragma once

#include <cstdint>
#include <utility>

namespace shardcache {

// splitmix64: a counter-based generator; the whole stream is a function of its seed.
class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}
  uint64_t Next() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  // Unbiased draw in [0, bound) (Lemire 2019). REQUIRES: bound > 0.
  uint64_t Below(uint64_t bound) {
    unsigned __int128 m = static_cast<unsigned __int128>(Next()) * bound;
    uint64_t low = static_cast<uint64_t>(m);
    if (low < bound) {
      const uint64_t threshold = (0 - bound) % bound;
      while (low < threshold) {
        m = static_cast<unsigned __int128>(Next()) * bound;
        low = static_cast<uint64_t>(m);
      }
    }
    return static_cast<uint64_t>(m >> 64);
  }

 private:
  uint64_t state_;
};

// Fisher-Yates over [first, first + count).
template <typename T>
void Shuffle(T* first, uint64_t count, SplitMix64& rng) {
  for (uint64_t i = count; i > 1; --i) {
    const uint64_t j = rng.Below(i);
    std::swap(first[i - 1], first[j]);
  }
}

}  // namespace shardcache
