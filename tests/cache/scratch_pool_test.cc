#include "daemon/cache/scratch_pool.h"

#include <catch2/catch.hpp>

#include <atomic>
#include <thread>
#include <vector>

namespace shardcache::cache {
namespace {

TEST_CASE("scratch pool: a returned buffer serves the next read, and no more than the cap is kept", "[cache]") {
  ScratchPool pool(2, 1 << 20);
  uint8_t* first = nullptr;
  {
    auto lease = pool.Borrow(8192);
    first = lease.data();
    REQUIRE(first != nullptr);
  }
  CHECK(pool.pooled() == 1);
  {
    auto again = pool.Borrow(4096);
    CHECK(again.data() == first);
    CHECK(pool.pooled() == 0);
  }
  {
    auto a = pool.Borrow(4096), b = pool.Borrow(4096), c = pool.Borrow(4096);
    CHECK(a.data() != b.data());
    CHECK(b.data() != c.data());
  }
  CHECK(pool.pooled() == 2);  // the third went back to the heap
}

TEST_CASE("scratch pool: oversized and empty requests are never pooled", "[cache]") {
  ScratchPool pool(4, 64 << 10);
  {
    auto big = pool.Borrow(1 << 20);
    REQUIRE(big.data() != nullptr);
    big.data()[(1 << 20) - 1] = 7;  // the whole size is writable
    auto none = pool.Borrow(0);
    CHECK(none.data() == nullptr);
  }
  CHECK(pool.pooled() == 0);
}

TEST_CASE("scratch pool: a pooled buffer too small for a read is grown for it", "[cache]") {
  ScratchPool pool(1, 4 << 20);
  { auto small = pool.Borrow(4096); }
  auto large = pool.Borrow(2 << 20);
  large.data()[(2 << 20) - 1] = 1;
  CHECK(pool.pooled() == 0);
}

TEST_CASE("scratch pool: concurrent borrowers never share a buffer", "[cache]") {
  ScratchPool pool(2, 1 << 20);
  std::vector<std::thread> threads;
  std::atomic<int> clashes{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&pool, &clashes, t] {
      for (int i = 0; i < 2000; ++i) {
        auto lease = pool.Borrow(4096);
        lease.data()[0] = static_cast<uint8_t>(t);
        std::this_thread::yield();
        if (lease.data()[0] != static_cast<uint8_t>(t)) clashes.fetch_add(1);
      }
    });
  }
  for (auto& th : threads) th.join();
  CHECK(clashes.load() == 0);
  CHECK(pool.pooled() <= 2);
}

}  // namespace
}  // namespace shardcache::cache
