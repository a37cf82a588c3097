#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <set>

#include "daemon/plan/epoch_plan.h"
#include "daemon/plan/rank_slice.h"

using namespace shardcache;
using namespace shardcache::plan;

namespace {

// Shards of uneven sizes, like a real dataset's last shard.
DatasetLayout Layout(std::vector<uint64_t> samples, uint64_t bytes_per_sample = 1024,
                     std::string version = "v-test") {
  DatasetLayout l;
  l.version = std::move(version);
  l.chunk_bytes = 64 * 1024;
  l.shard_samples = samples;
  for (uint64_t s : samples) l.shard_bytes.push_back(s * bytes_per_sample);
  return l;
}

std::shared_ptr<const EpochPlan> MakePlan(const DatasetLayout& l, PlanOptions o) {
  auto p = EpochPlan::Make(l, o);
  REQUIRE(p.ok());
  return *p;
}


// One loader's whole read, in order.
std::vector<uint64_t> Read(const RankSlice& s) {
  std::vector<uint64_t> out;
  for (uint64_t i = 0; i < s.size(); ++i) out.push_back(s.SampleAt(i));
  return out;
}

std::vector<uint64_t> RankOrder(std::shared_ptr<const EpochPlan> plan, SliceOptions o) {
  auto s = RankSlice::Make(std::move(plan), o);
  REQUIRE(s.ok());
  return Read(*s);
}

}  // namespace

TEST_CASE("every rank reads the same number of samples and each sample once, but for padding, "
          "for every mode, world size and tail",
          "[plan]") {
  const auto layout = Layout({97, 128, 3, 250, 1, 64, 77});  // 620 samples
  const uint64_t n = 620;
  for (auto mode : {ShuffleMode::kNone, ShuffleMode::kGlobal, ShuffleMode::kBlock}) {
    for (uint32_t world = 1; world <= 8; ++world) {
      for (Tail tail : {Tail::kPad, Tail::kDrop, Tail::kUneven}) {
        CAPTURE(ShuffleModeName(mode), world, TailName(tail));
        PlanOptions po;
        po.mode = mode;
        po.world_size = world;
        po.seed = 5;
        po.epoch = 2;
        auto plan = MakePlan(layout, po);
        SliceOptions o;
        o.world_size = world;
        o.batch_size = 16;
        o.tail = tail;
        std::vector<int> seen(n, 0);
        uint64_t total = 0, min_rank = UINT64_MAX, max_rank = 0;
        for (uint32_t r = 0; r < world; ++r) {
          o.rank = r;
          auto order = RankOrder(plan, o);
          min_rank = std::min<uint64_t>(min_rank, order.size());
          max_rank = std::max<uint64_t>(max_rank, order.size());
          for (uint64_t id : order) {
            REQUIRE(id < n);
            seen[id]++;
          }
          total += order.size();
          if (tail == Tail::kDrop) REQUIRE(order.size() % o.batch_size == 0);
        }
        if (tail == Tail::kDrop) {
          const uint64_t k = (n / world) / o.batch_size * o.batch_size;
          REQUIRE(min_rank == k);
          REQUIRE(max_rank == k);
          REQUIRE(std::all_of(seen.begin(), seen.end(), [](int c) { return c <= 1; }));
          // Dropped samples are the tail of the global order, the same for every rank's view.
          for (uint64_t p = k * world; p < n; ++p) REQUIRE(seen[plan->AtPosition(p)] == 0);
        } else if (tail == Tail::kPad) {
          // DistributedSampler's contract: equal counts, every sample at least once, and only
          // the padding (at most world - 1 samples) twice.
          REQUIRE(min_rank == (n + world - 1) / world);
          REQUIRE(max_rank == min_rank);
          REQUIRE(total - n == (world - n % world) % world);
          REQUIRE(std::all_of(seen.begin(), seen.end(), [](int c) { return c == 1 || c == 2; }));
        } else {
          REQUIRE(total == n);
          REQUIRE(max_rank - min_rank <= 1);
          REQUIRE(std::all_of(seen.begin(), seen.end(), [](int c) { return c == 1; }));
        }
      }
    }
  }
}

TEST_CASE("a padded rank repeats the start of its own slice", "[plan]") {
  // 10 samples on 4 ranks: ranks 2 and 3 have 2 samples of their own and repeat their first.
  auto plan = MakePlan(Layout({10}), PlanOptions{});
  SliceOptions o;
  o.world_size = 4;
  o.batch_size = 2;
  o.rank = 3;
  REQUIRE(RankOrder(plan, o) == std::vector<uint64_t>{3, 7, 3});
  o.rank = 1;
  REQUIRE(RankOrder(plan, o) == std::vector<uint64_t>{1, 5, 9});
  // Fewer samples than ranks: a rank with none of its own takes the first of the segment.
  auto tiny = MakePlan(Layout({2}), PlanOptions{});
  o.rank = 3;
  REQUIRE(RankOrder(tiny, o) == std::vector<uint64_t>{1});
  o.rank = 2;
  REQUIRE(RankOrder(tiny, o) == std::vector<uint64_t>{0});
}

TEST_CASE("workers of a rank together read its batches once, and in turn they give the rank's order",
          "[plan]") {
  const auto layout = Layout({97, 128, 3, 250});  // 478 samples
  PlanOptions po;
  po.mode = ShuffleMode::kGlobal;
  po.seed = 11;
  auto plan = MakePlan(layout, po);
  for (Tail tail : {Tail::kPad, Tail::kDrop, Tail::kUneven}) {
    for (uint64_t rank_start : {uint64_t{0}, uint64_t{7}, uint64_t{40}, uint64_t{159}, uint64_t{1000}}) {
      for (uint32_t workers = 1; workers <= 5; ++workers) {
        CAPTURE(TailName(tail), rank_start, workers);
        SliceOptions o;
        o.rank = 1;
        o.world_size = 3;
        o.batch_size = 8;
        o.tail = tail;
        o.rank_start = rank_start;
        const auto whole = RankOrder(plan, o);  // one loader, no workers
        std::vector<RankSlice> slices;
        for (uint32_t k = 0; k < workers; ++k) {
          o.worker = k;
          o.num_workers = workers;
          auto s = RankSlice::Make(plan, o);
          REQUIRE(s.ok());
          slices.push_back(*s);
        }
        // torch's in-order round robin: one batch from each worker in turn, a worker that is
        // done is skipped.
        std::vector<uint64_t> merged;
        std::vector<uint64_t> next(workers, 0);
        uint64_t consumed = std::min(rank_start, slices[0].rank_samples());
        for (bool any = true; any;) {
          any = false;
          for (uint32_t k = 0; k < workers; ++k) {
            const RankSlice& s = slices[k];
            if (next[k] >= s.size()) continue;
            const uint64_t end = std::min(s.size(), next[k] + o.batch_size);
            for (uint64_t i = next[k]; i < end; ++i) merged.push_back(s.SampleAt(i));
            next[k] = end;
            // The resume point after this batch is where the merged stream stands.
            REQUIRE(s.RankConsumedAfter(end) == consumed + (end - (end - 1) / o.batch_size * o.batch_size));
            consumed = s.RankConsumedAfter(end);
            any = true;
          }
        }
        REQUIRE(merged == whole);
        REQUIRE(consumed == slices[0].rank_samples());
      }
    }
  }
}

TEST_CASE("a job resumed on another number of ranks reads the rest of the epoch exactly once",
          "[plan]") {
  const auto layout = Layout({100, 100, 100, 60});  // 360 samples
  for (auto mode : {ShuffleMode::kNone, ShuffleMode::kGlobal, ShuffleMode::kBlock}) {
    for (uint32_t new_world : {3u, 4u, 6u, 1u}) {
      CAPTURE(ShuffleModeName(mode), new_world);
      PlanOptions po;
      po.mode = mode;
      po.seed = 7;
      po.epoch = 3;
      po.world_size = 4;
      auto plan = MakePlan(layout, po);
      // 4 ranks consumed 5 batches of 6 each: global positions [0, 120).
      SliceOptions o;
      o.world_size = 4;
      o.batch_size = 6;
      o.tail = Tail::kUneven;
      std::vector<int> seen(360, 0);
      for (uint32_t r = 0; r < 4; ++r) {
        o.rank = r;
        auto order = RankOrder(plan, o);
        for (size_t i = 0; i < 30; ++i) seen[order[i]]++;
      }
      // The resumed job names the window the plan used, so its order is the same even though
      // an automatic window depends on the world size.
      PlanOptions resumed = po;
      resumed.world_size = new_world;
      resumed.block_window_shards = plan->window_shards();
      auto plan2 = MakePlan(layout, resumed);
      o.world_size = new_world;
      o.start_position = 30 * 4;
      for (uint32_t r = 0; r < new_world; ++r) {
        o.rank = r;
        for (uint64_t id : RankOrder(plan2, o)) seen[id]++;
      }
      REQUIRE(std::all_of(seen.begin(), seen.end(), [](int c) { return c == 1; }));
    }
  }
}

TEST_CASE("bad slice options are refused with the field named", "[plan]") {
  auto plan = MakePlan(Layout({10}), PlanOptions{});
  auto expect = [&](SliceOptions o, const char* field) {
    auto s = RankSlice::Make(plan, o);
    REQUIRE(!s.ok());
    REQUIRE(s.status().message().find(field) != std::string::npos);
  };
  SliceOptions o;
  o.rank = 2;
  o.world_size = 2;
  expect(o, "world_size");
  o = {};
  o.batch_size = 0;
  expect(o, "batch_size");
  o = {};
  o.worker = 3;
  o.num_workers = 3;
  expect(o, "num_workers");
  o = {};
  o.start_position = 11;
  expect(o, "start_position");
  o = {};
  o.tail = static_cast<Tail>(7);
  expect(o, "tail");
}

TEST_CASE("a plan is a pure function of its inputs and changes with seed, epoch and version",
          "[plan]") {
  const auto layout = Layout({500, 500, 500, 500});
  PlanOptions o;
  o.mode = ShuffleMode::kGlobal;
  o.seed = 17;
  o.epoch = 0;
  const auto a = RankOrder(MakePlan(layout, o), {});
  REQUIRE(a == RankOrder(MakePlan(layout, o), {}));
  std::vector<uint64_t> identity(a.size());
  std::iota(identity.begin(), identity.end(), 0);
  REQUIRE(a != identity);
  auto o2 = o;
  o2.epoch = 1;
  REQUIRE(RankOrder(MakePlan(layout, o2), {}) != a);
  o2 = o;
  o2.seed = 18;
  REQUIRE(RankOrder(MakePlan(layout, o2), {}) != a);
  REQUIRE(RankOrder(MakePlan(Layout({500, 500, 500, 500}, 1024, "v-other"), o), {}) != a);

  // Fixed values guard against accidental changes of the generator: plans must stay the same
  // across releases and platforms, or a resumed job would read a different order.
  REQUIRE(PlanKey("v-test", 17, 0) == PlanKey("v-test", 17, 0));
  std::vector<uint64_t> first(a.begin(), a.begin() + 4);
  INFO("first ids: " << first[0] << " " << first[1] << " " << first[2] << " " << first[3]);
  o.mode = ShuffleMode::kNone;
  REQUIRE(RankOrder(MakePlan(layout, o), {}) == identity);
}

TEST_CASE("block mode reads one window of shards at a time", "[plan]") {
  // 40 shards of 100 samples; window of 4 shards.
  const auto layout = Layout(std::vector<uint64_t>(40, 100));
  PlanOptions o;
  o.mode = ShuffleMode::kBlock;
  o.block_window_shards = 4;
  o.seed = 3;
  auto plan = MakePlan(layout, o);
  REQUIRE(plan->window_shards() == 4);
  auto order = RankOrder(plan, {});
  REQUIRE(order.size() == 4000);
  std::set<uint64_t> shards_in_window;
  for (size_t i = 0; i < order.size(); ++i) {
    if (i % 400 == 0) shards_in_window.clear();
    shards_in_window.insert(order[i] / 100);
    REQUIRE(shards_in_window.size() <= 4);
  }
  // Samples are shuffled inside the window, not left in file order.
  REQUIRE(!std::is_sorted(order.begin(), order.begin() + 400));
  // Shard order is shuffled too.
  REQUIRE(order[0] / 100 + order[400] / 100 + order[800] / 100 != 0 + 4 + 8);
}

TEST_CASE("block mode sizes its window to a few chunks per rank by default", "[plan]") {
  // 1 KiB samples, 64 KiB chunks, shards of 16 KiB: 4 chunks x 2 ranks = 512 KiB = 32 shards.
  const auto layout = Layout(std::vector<uint64_t>(100, 16));
  PlanOptions o;
  o.mode = ShuffleMode::kBlock;
  o.world_size = 2;
  REQUIRE(MakePlan(layout, o)->window_shards() == 32);
  // Shards larger than the target: one shard per window.
  REQUIRE(MakePlan(Layout(std::vector<uint64_t>(10, 4096)), o)->window_shards() == 1);
}

TEST_CASE("resuming mid-epoch yields exactly the remaining order", "[plan]") {
  const auto layout = Layout({1000, 333, 667});
  for (auto mode : {ShuffleMode::kNone, ShuffleMode::kGlobal, ShuffleMode::kBlock}) {
    PlanOptions o;
    o.mode = mode;
    o.world_size = 3;
    o.seed = 99;
    o.epoch = 4;
    SliceOptions so;
    so.rank = 1;
    so.world_size = 3;
    so.batch_size = 10;
    const auto full = RankOrder(MakePlan(layout, o), so);
    for (uint64_t consumed : {uint64_t{0}, uint64_t{1}, uint64_t{250}, uint64_t{full.size() - 1},
                              uint64_t{full.size()}}) {
      // A fresh plan (as after a restart) resumed at `consumed`, inside the old segment or as a
      // new segment at the global position all ranks reached.
      so.rank_start = consumed;
      so.start_position = 0;
      const auto rest = RankOrder(MakePlan(layout, o), so);
      REQUIRE(rest == std::vector<uint64_t>(full.begin() + consumed, full.end()));
      so.rank_start = 0;
      so.start_position = consumed * 3;
      if (consumed < full.size()) REQUIRE(RankOrder(MakePlan(layout, o), so) == rest);
    }
  }
}

TEST_CASE("bad plan options are rejected with a clear error", "[plan]") {
  PlanOptions o;
  o.world_size = 0;
  auto p = EpochPlan::Make(Layout({10}), o);
  REQUIRE(!p.ok());
  REQUIRE(p.status().message().find("world_size") != std::string::npos);
  REQUIRE(!ParseShuffleMode("random").ok());
  REQUIRE(*ParseShuffleMode("block") == ShuffleMode::kBlock);
}

TEST_CASE("an empty dataset has an empty plan", "[plan]") {
  PlanOptions o;
  o.mode = ShuffleMode::kGlobal;
  o.world_size = 4;
  auto plan = MakePlan(Layout({}), o);
  SliceOptions so;
  so.world_size = 4;
  so.rank = 3;
  REQUIRE(RankOrder(plan, so).empty());
}

TEST_CASE("plans for millions of samples are cheap", "[plan]") {
  // 4M samples in 4000 shards: build time and memory are reported, not asserted tightly.
  const auto layout = Layout(std::vector<uint64_t>(4000, 1000));
  for (auto mode : {ShuffleMode::kGlobal, ShuffleMode::kBlock}) {
    PlanOptions o;
    o.mode = mode;
    o.world_size = 8;
    auto t0 = std::chrono::steady_clock::now();
    auto plan = MakePlan(layout, o);
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    WARN(ShuffleModeName(mode) << " plan of 4M samples: " << ms << " ms, 4 bytes/sample");
    SliceOptions so;
    so.rank = 7;
    so.world_size = 8;
    auto slice = RankSlice::Make(plan, so);
    REQUIRE(slice.ok());
    REQUIRE(slice->size() == 500000);
    REQUIRE(ms < 10000);
  }
}
