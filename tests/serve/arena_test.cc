#include <catch2/catch.hpp>

#include <fcntl.h>
#include <unistd.h>

#include "daemon/serve/arena.h"

using namespace shardcache;
using namespace shardcache::serve;

TEST_CASE("an arena is a sealed memfd split into aligned slots", "[serve][arena]") {
  auto a = Arena::Create(1 << 20, 3);
  REQUIRE(a.ok());
  REQUIRE((*a)->slot_bytes() % 4096 == 0);
  REQUIRE((*a)->slot_bytes() * 3 <= (1 << 20));
  REQUIRE((*a)->SlotOffset(2) == 2 * (*a)->slot_bytes());
  // Neither side can resize it: a shrink would SIGBUS the other side's mapping.
  REQUIRE(ftruncate((*a)->fd(), 4096) != 0);
  REQUIRE(errno == EPERM);
  REQUIRE((fcntl((*a)->fd(), F_GET_SEALS) & (F_SEAL_GROW | F_SEAL_SHRINK)) == (F_SEAL_GROW | F_SEAL_SHRINK));
  // Not a file in /dev/shm: an anonymous memfd.
  char link[256] = {};
  REQUIRE(readlink(("/proc/self/fd/" + std::to_string((*a)->fd())).c_str(), link, sizeof(link) - 1) > 0);
  REQUIRE(std::string(link).rfind("/memfd:", 0) == 0);
}

TEST_CASE("arena slots have one owner at a time", "[serve][arena]") {
  auto a = Arena::Create(64 * 4096, 4);
  REQUIRE(a.ok());
  Arena& arena = **a;
  std::vector<uint32_t> got;
  for (int i = 0; i < 4; ++i) {
    auto s = arena.TryAcquire(i < 2 ? 1 : 2);
    REQUIRE(s.has_value());
    got.push_back(*s);
  }
  REQUIRE(!arena.TryAcquire(1).has_value());
  REQUIRE(arena.FreeSlots() == 0);
  arena.MarkDelivered(got[0]);
  REQUIRE(arena.DeliveredSlots() == 1);
  // Releasing a slot one does not own is refused and changes nothing.
  REQUIRE(arena.Release(got[0], 2).code() == StatusCode::kFailedPrecondition);
  REQUIRE(arena.Release(99, 1).code() == StatusCode::kFailedPrecondition);
  REQUIRE(arena.Release(got[0], 1).ok());
  REQUIRE(arena.Release(got[0], 1).code() == StatusCode::kFailedPrecondition);
  REQUIRE(arena.ReleaseAll(2) == 2);
  REQUIRE(arena.FreeSlots() == 3);
  REQUIRE(arena.WaitForFree(std::chrono::steady_clock::now()));
}

TEST_CASE("arena sizes that leave no room are rejected", "[serve][arena]") {
  REQUIRE(Arena::Create(1 << 20, 0).status().code() == StatusCode::kInvalidArgument);
  REQUIRE(Arena::Create(8192, 4).status().code() == StatusCode::kInvalidArgument);
}
