#include <catch2/catch.hpp>

#include <fcntl.h>
#include <sys/mman.h>
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

TEST_CASE("an arena faults in the front of every slot, 64 MiB at creation and a loader's batch size later",
          "[serve][arena]") {
  // 4 slots of 32 MiB: 64 MiB breadth first is the first 16 MiB of each slot.
  auto a = Arena::Create(128ull << 20, 4);
  REQUIRE(a.ok());
  {
    // Asked of the kernel directly, so that an arena that stopped prefaulting cannot pass.
    void* probe = mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    REQUIRE(probe != MAP_FAILED);
    const bool supported = madvise(probe, 4096, MADV_POPULATE_WRITE) == 0;
    munmap(probe, 4096);
    if (!supported) {
      WARN("this kernel has no MADV_POPULATE_WRITE; pages are faulted on first use");
      return;
    }
  }
  REQUIRE((*a)->prefaulted_bytes() == (64ull << 20));
  auto resident = [&](uint32_t slot, uint64_t off) {
    unsigned char v = 0;
    REQUIRE(mincore((*a)->SlotData(slot) + off, 4096, &v) == 0);
    return (v & 1) != 0;
  };
  for (uint32_t slot = 0; slot < 4; ++slot) {
    CHECK(resident(slot, 0));
    CHECK(resident(slot, (16ull << 20) - 4096));
    CHECK(!resident(slot, 16ull << 20));
    CHECK(!resident(slot, (32ull << 20) - 4096));
  }
  // A small arena is faulted in whole.
  auto small = Arena::Create(1 << 20, 3);
  REQUIRE(small.ok());
  REQUIRE((*small)->prefaulted_bytes() == (*small)->arena_bytes());

  // A loader's batches need 20 MiB of every slot: the 4 MiB beyond the first 16 are faulted
  // in, nothing further, and nothing twice.
  (*a)->PrefaultFronts(20ull << 20, 256ull << 20);
  CHECK((*a)->prefaulted_bytes() == (80ull << 20));
  for (uint32_t slot = 0; slot < 4; ++slot) {
    CHECK(resident(slot, (20ull << 20) - 4096));
    CHECK(!resident(slot, 20ull << 20));
  }
  (*a)->PrefaultFronts(8ull << 20, 256ull << 20);
  CHECK((*a)->prefaulted_bytes() == (80ull << 20));
  // A front that ends inside a page counts the whole page, and a longer one later goes on
  // from there (madvise takes page-aligned starts only).
  (*a)->PrefaultFronts((20ull << 20) + 100, 256ull << 20);
  CHECK((*a)->prefaulted_bytes() == (80ull << 20) + 4 * 4096);
  (*a)->PrefaultFronts(21ull << 20, 256ull << 20);
  CHECK((*a)->prefaulted_bytes() == (84ull << 20));
  for (uint32_t slot = 0; slot < 4; ++slot) CHECK(resident(slot, (21ull << 20) - 4096));
  // The cap counts what is faulted in already: 88 MiB allows 8 more, breadth first (a stretch
  // of every slot at a time), so 2 MiB more of each slot.
  (*a)->PrefaultFronts(32ull << 20, 88ull << 20);
  CHECK((*a)->prefaulted_bytes() == (88ull << 20));
  for (uint32_t slot = 0; slot < 4; ++slot) {
    CHECK(resident(slot, (22ull << 20) - 4096));
    CHECK(!resident(slot, 22ull << 20));
  }
}
