#include <catch2/catch.hpp>

#include "daemon/cache/access_plan.h"

using namespace shardcache;
using namespace shardcache::cache;

TEST_CASE("access plan reports the distance to each chunk's next planned use", "[cache][plan]") {
  AccessPlan plan;
  std::vector<ChunkRef> order = {{0, 5}, {0, 6}, {0, 5}, {1, 0}};
  plan.SetFutureAccessOrder("ver", 100, order);
  const auto v = VersionId("ver");
  CHECK(plan.NextUseDistance(Fingerprint(ChunkKey{v, 0, 5})) == 0);
  CHECK(plan.NextUseDistance(Fingerprint(ChunkKey{v, 0, 6})) == 1);
  CHECK(plan.NextUseDistance(Fingerprint(ChunkKey{v, 1, 0})) == 3);
  CHECK(plan.NextUseDistance(Fingerprint(ChunkKey{v, 9, 9})) == AccessPlan::kNever);

  SECTION("a demand read moves the clock past it, so the repeat becomes the next use") {
    plan.OnDemandRead(ChunkKey{v, 0, 5});
    CHECK(plan.Now("ver") == 101);
    CHECK(plan.NextUseDistance(Fingerprint(ChunkKey{v, 0, 5})) == 1);  // position 102
    CHECK(plan.NextUseDistance(Fingerprint(ChunkKey{v, 0, 6})) == 0);
  }
  SECTION("the planner can advance the clock explicitly; past uses no longer count") {
    plan.Advance("ver", 103);
    CHECK(plan.NextUseDistance(Fingerprint(ChunkKey{v, 0, 5})) == AccessPlan::kNever);
    CHECK(plan.NextUseDistance(Fingerprint(ChunkKey{v, 1, 0})) == 0);
  }
  SECTION("an empty order removes the plan") {
    plan.SetFutureAccessOrder("ver", 0, {});
    CHECK(plan.empty());
  }
}
