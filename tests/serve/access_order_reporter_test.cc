// AccessOrderReporter on its own: the future chunk order of the ranks open on the node, the rest
// of the epoch then the next one; openings coalesced into one report, a report repeated only
// when something new opens; nothing without an observer.
#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <mutex>
#include <thread>
#include <vector>

#include "daemon/plan/epoch_plan.h"
#include "daemon/plan/rank_slice.h"
#include "daemon/serve/access_order_reporter.h"
#include "local_fixture.h"
#include "testing/eventually.h"

using namespace shardcache;
using shardcache::testing::Fixture;

namespace {

// Records the reports the observer receives.
struct Reports {
  std::mutex mu;
  std::vector<std::vector<serve::ChunkAccess>> orders;
  std::vector<std::string> datasets;

  serve::AccessOrderObserver Observer() {
    return [this](const DatasetPtr& d, const std::vector<serve::ChunkAccess>& order) {
      std::lock_guard<std::mutex> l(mu);
      datasets.push_back(d->name);
      orders.push_back(order);
    };
  }
  size_t count() {
    std::lock_guard<std::mutex> l(mu);
    return orders.size();
  }
};

plan::PlanOptions Options(uint64_t epoch, uint32_t world) {
  plan::PlanOptions po;
  po.seed = 4;
  po.epoch = epoch;
  po.mode = plan::ShuffleMode::kGlobal;
  po.world_size = world;
  return po;
}

std::shared_ptr<const plan::EpochPlan> Plan(const Fixture& f, uint64_t epoch, uint32_t world) {
  auto p = plan::EpochPlan::Make(plan::LayoutOf(*f.records), Options(epoch, world));
  REQUIRE(p.ok());
  return *p;
}

plan::RankSlice Slice(std::shared_ptr<const plan::EpochPlan> plan, uint32_t rank, uint32_t world,
                      uint64_t rank_start = 0) {
  plan::SliceOptions so;
  so.rank = rank;
  so.world_size = world;
  so.batch_size = 10;
  so.rank_start = rank_start;
  auto s = plan::RankSlice::Make(std::move(plan), so);
  REQUIRE(s.ok());
  return *s;
}

// The chunks of the records dataset (250 records of 1000 bytes per shard, 64 KiB chunks) that
// the global positions of `ranks` read, from position `from` of epoch `epoch` to the end of
// epoch + 1, consecutive repeats collapsed.
std::vector<serve::ChunkAccess> Want(const Fixture& f, uint64_t epoch, uint32_t world,
                                     const std::vector<uint32_t>& ranks, uint64_t from) {
  std::vector<serve::ChunkAccess> want;
  for (uint64_t e : {epoch, epoch + 1}) {
    auto p = Plan(f, e, world);
    for (uint64_t pos = e == epoch ? from : 0; pos < p->dataset_samples(); ++pos) {
      if (std::find(ranks.begin(), ranks.end(), pos % world) == ranks.end()) continue;
      const uint64_t id = p->AtPosition(pos);
      const uint32_t shard = static_cast<uint32_t>(id / 250);
      const uint64_t off = (id % 250) * 1000;
      for (uint64_t ch = off / 65536; ch <= (off + 999) / 65536; ++ch) {
        if (!want.empty() && want.back().shard == shard && want.back().chunk == ch) continue;
        want.push_back({shard, ch});
      }
    }
  }
  return want;
}

void CheckOrder(const std::vector<serve::ChunkAccess>& got, const std::vector<serve::ChunkAccess>& want) {
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    REQUIRE(got[i].shard == want[i].shard);
    REQUIRE(got[i].chunk == want[i].chunk);
  }
}

}  // namespace

TEST_CASE("the reporter reports the node's future chunk order, openings coalesced", "[serve]") {
  Fixture f;
  Reports reports;
  serve::AccessOrderReporter reporter({reports.Observer(), 100});
  REQUIRE(reporter.enabled());
  reporter.Start();
  auto locator = std::make_shared<serve::SampleLocator>(*f.files, f.records);
  auto plan = Plan(f, 6, 3);
  // Ranks 0 and 2 of a 3-rank job open together: one report for both.
  reporter.NoteLoader(f.records, locator, Slice(plan, 0, 3));
  reporter.NoteLoader(f.records, locator, Slice(plan, 2, 3));
  REQUIRE(testing::Eventually([&] { return reports.count() > 0; }));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  REQUIRE(reports.count() == 1);
  CHECK(reports.datasets == std::vector<std::string>{"rec"});
  CheckOrder(reports.orders[0], Want(f, 6, 3, {0, 2}, 0));

  // A rank already reported, at the same or a later point: nothing new.
  reporter.NoteLoader(f.records, locator, Slice(plan, 0, 3));
  reporter.NoteLoader(f.records, locator, Slice(plan, 2, 3, 50));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  CHECK(reports.count() == 1);

  // Another rank of the job: reported again, now for the three.
  reporter.NoteLoader(f.records, locator, Slice(plan, 1, 3));
  REQUIRE(testing::Eventually([&] { return reports.count() > 1; }));
  reporter.Stop();
  REQUIRE(reports.count() == 2);
  CheckOrder(reports.orders[1], Want(f, 6, 3, {0, 1, 2}, 0));
}

TEST_CASE("the reporter starts from the earliest local rank's resume point", "[serve]") {
  Fixture f;
  Reports reports;
  serve::AccessOrderReporter reporter({reports.Observer(), 10});
  reporter.Start();
  auto locator = std::make_shared<serve::SampleLocator>(*f.files, f.records);
  auto plan = Plan(f, 1, 2);
  // Rank 1 of 2 resumed after 100 of its samples: global position 200 onwards.
  reporter.NoteLoader(f.records, locator, Slice(plan, 1, 2, 100));
  REQUIRE(testing::Eventually([&] { return reports.count() > 0; }));
  reporter.Stop();
  CheckOrder(reports.orders[0], Want(f, 1, 2, {1}, 200));
}

TEST_CASE("the reporter without an observer does nothing", "[serve]") {
  Fixture f;
  serve::AccessOrderReporter reporter({{}, 10});
  CHECK_FALSE(reporter.enabled());
  reporter.Start();
  auto locator = std::make_shared<serve::SampleLocator>(*f.files, f.records);
  reporter.NoteLoader(f.records, locator, Slice(Plan(f, 0, 1), 0, 1));
  reporter.Stop();
  reporter.Stop();  // idempotent
}
