// LoaderFactory on its own (no socket, no client): requests refused with a message naming what
// was wrong, plans shared by loaders with equal plan parameters, batch rings sized, ids given
// out, and every loader opened noted to the access-order reporter.
#include <catch2/catch.hpp>

#include <mutex>
#include <vector>

#include "daemon/serve/access_order_reporter.h"
#include "daemon/serve/arena.h"
#include "daemon/serve/loader_factory.h"
#include "local_fixture.h"
#include "shardcache/local.pb.h"
#include "shardcache/local_wire.h"
#include "testing/eventually.h"

using namespace shardcache;
using shardcache::testing::Fixture;

namespace {

v1::OpenLoaderRequest Request(uint32_t rank, uint32_t world, uint32_t batch, uint64_t epoch = 2) {
  v1::OpenLoaderRequest r;
  r.set_dataset("rec");
  r.set_batch_size(batch);
  r.set_seed(3);
  r.set_epoch(epoch);
  r.set_shuffle(v1::SHUFFLE_GLOBAL);
  r.set_rank(rank);
  r.set_world_size(world);
  return r;
}

std::unique_ptr<serve::Arena> MakeArena(uint64_t bytes = 4 << 20, uint32_t slots = 8) {
  auto a = serve::Arena::Create(bytes, slots);
  REQUIRE(a.ok());
  return std::move(*a);
}

// The error of opening `r`, which must fail.
Status Refusal(serve::LoaderFactory& factory, serve::Arena& arena, const v1::OpenLoaderRequest& r,
               uint32_t protocol = local_wire::kProtocolVersion) {
  auto opened = factory.Open(arena, r, protocol);
  REQUIRE_FALSE(opened.ok());
  return opened.status();
}

}  // namespace

TEST_CASE("the loader factory refuses a bad request with a message naming what was wrong", "[serve]") {
  Fixture f;
  serve::LoaderFactory factory(*f.files, {});
  auto arena = MakeArena();

  auto r = Request(0, 2, 10);
  r.set_batch_size(0);
  Status s = Refusal(factory, *arena, r);
  CHECK(s.code() == StatusCode::kInvalidArgument);
  CHECK_THAT(s.message(), Catch::Contains("batch_size 0"));

  r = Request(2, 2, 10);
  s = Refusal(factory, *arena, r);
  CHECK(s.code() == StatusCode::kInvalidArgument);
  CHECK_THAT(s.message(), Catch::Contains("rank 2"));

  r = Request(0, 1, 10);
  r.set_worker(3);
  r.set_num_workers(2);
  s = Refusal(factory, *arena, r);
  CHECK(s.code() == StatusCode::kInvalidArgument);
  CHECK_THAT(s.message(), Catch::Contains("worker 3"));

  r = Request(0, 1, 10);
  r.set_dataset("nope");
  s = Refusal(factory, *arena, r);
  CHECK_THAT(s.message(), Catch::Contains("nope"));

  r = Request(0, 1, 10);
  r.set_expect_version("not-the-version");
  s = Refusal(factory, *arena, r);
  CHECK(s.code() == StatusCode::kFailedPrecondition);
  CHECK_THAT(s.message(), Catch::Contains("not-the-version"));
  CHECK_THAT(s.message(), Catch::Contains(f.records->version));

  // 1000-byte records in 512 KiB slots: 600 of them do not fit.
  r = Request(0, 1, 600);
  s = Refusal(factory, *arena, r);
  CHECK(s.code() == StatusCode::kResourceExhausted);
  CHECK_THAT(s.message(), Catch::Contains("600 records of 1000 bytes"));

  // Refused requests take no loader id.
  auto ok = factory.Open(*arena, Request(0, 1, 10), local_wire::kProtocolVersion);
  REQUIRE(ok.ok());
  CHECK(ok->pipeline->id() == 1);
}

TEST_CASE("loaders with equal plan parameters share one plan", "[serve]") {
  Fixture f;
  serve::LoaderFactory factory(*f.files, {});
  auto arena = MakeArena();
  const uint32_t v = local_wire::kProtocolVersion;
  // Ranks of one job, and a loader of another world size and batch size: one order.
  auto a = factory.Open(*arena, Request(0, 2, 10), v);
  auto b = factory.Open(*arena, Request(1, 2, 10), v);
  auto c = factory.Open(*arena, Request(0, 4, 7), v);
  auto other_epoch = factory.Open(*arena, Request(0, 2, 10, 3), v);
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  REQUIRE(c.ok());
  REQUIRE(other_epoch.ok());
  CHECK(a->pipeline->id() == 1);
  CHECK(b->pipeline->id() == 2);
  CHECK(a->dataset->version == f.records->version);
  const plan::EpochPlan* shared = a->pipeline->slice().plan().get();
  CHECK(b->pipeline->slice().plan().get() == shared);
  CHECK(c->pipeline->slice().plan().get() == shared);
  CHECK(other_epoch->pipeline->slice().plan().get() != shared);
  CHECK(other_epoch->pipeline->slice().plan()->options().epoch == 3);
  CHECK(serve::PlanKey(f.records, a->pipeline->slice().plan()->options()) ==
        serve::PlanKey(f.records, c->pipeline->slice().plan()->options()));
}

TEST_CASE("the loader factory sizes a loader's batch ring to half the arena", "[serve]") {
  Fixture f;
  serve::LoaderFactory factory(*f.files, {});
  auto arena = MakeArena(4 << 20, 8);
  auto r = Request(0, 1, 10);
  r.set_batch_ring(true);
  auto opened = factory.Open(*arena, r, local_wire::kProtocolVersion);
  REQUIRE(opened.ok());
  REQUIRE(opened->pipeline->ring() != nullptr);
  CHECK(opened->pipeline->ring()->entries() == serve::RingEntriesFor(4, 10));
  CHECK(opened->pipeline->ring()->entries() == 4);
  auto plain = factory.Open(*arena, Request(0, 1, 10), local_wire::kProtocolVersion);
  REQUIRE(plain.ok());
  CHECK(plain->pipeline->ring() == nullptr);
}

TEST_CASE("the loader factory notes every loader it opens to the reporter", "[serve]") {
  Fixture f;
  std::mutex mu;
  std::vector<std::string> reported;
  serve::AccessOrderReporter reporter({[&](const DatasetPtr& d, const std::vector<serve::ChunkAccess>& order) {
                                         std::lock_guard<std::mutex> l(mu);
                                         if (!order.empty()) reported.push_back(d->name);
                                       },
                                       20});
  reporter.Start();
  serve::LoaderFactory factory(*f.files, {}, &reporter);
  auto arena = MakeArena();
  auto opened = factory.Open(*arena, Request(0, 2, 10), local_wire::kProtocolVersion);
  REQUIRE(opened.ok());
  REQUIRE(testing::Eventually([&] {
    std::lock_guard<std::mutex> l(mu);
    return !reported.empty();
  }));
  reporter.Stop();
  std::lock_guard<std::mutex> l(mu);
  CHECK(reported == std::vector<std::string>{"rec"});
}
