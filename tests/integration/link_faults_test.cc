// The fault suite: a 2-rank epoch through a node whose long link (../shared/tools/wanem.py
// between it and the origin) resets connections, stalls, goes down and comes back, or turns
// into a black hole. Under each the epoch completes with every sample's bytes right and in the
// plan's order; a link that stays down ends the trainers' reads with a clear error within a
// bound, the daemon stays up, and reads work again once the link is back. The [slow] variants
// (make test-slow) run the same faults harder and longer over a bigger dataset.
#include <catch2/catch.hpp>

#include <signal.h>

#include <chrono>
#include <thread>

#include "integration/training_job.h"

using namespace shardcache;
using namespace shardcache::testing;
using Clock = std::chrono::steady_clock;

namespace {

bool HaveWanem() {
  if (WanemPath().empty()) {
    WARN("../shared/tools/wanem.py not found; link fault tests skipped");
    return false;
  }
  return true;
}

// Both ranks read the epoch while `during` runs (it may toggle the link); then each rank's
// order equals the plan's and every byte was checked by the readers.
template <typename Fn>
void RequireExactEpoch(JobRig& rig, Fn during) {
  Rank ranks[2];
  std::thread t0 = rig.Reader(0, &ranks[0]), t1 = rig.Reader(1, &ranks[1]);
  during(ranks);
  t0.join();
  t1.join();
  INFO("node log:\n" << LogTail(rig.node->log));
  REQUIRE(ranks[0].error.ok());
  REQUIRE(ranks[1].error.ok());
  CHECK(ranks[0].ids.size() + ranks[1].ids.size() == rig.samples());
  CHECK(ranks[0].ids == PlanOrder(rig.node->socket, 0));
  CHECK(ranks[1].ids == PlanOrder(rig.node->socket, 1));
}

void Nothing(Rank*) {}

// Toggles the link down for `down`, `times` times, `every` apart, once the ranks have started.
auto Flaps(JobRig& rig, int times, std::chrono::milliseconds down, std::chrono::milliseconds every) {
  return [&rig, times, down, every](Rank* ranks) {
    REQUIRE(Eventually([&] { return ranks[0].batches + ranks[1].batches >= 1; }, std::chrono::seconds(30)));
    for (int i = 0; i < times; ++i) {
      rig.wanem->Signal(SIGUSR1);  // down: connections reset, new ones refused
      std::this_thread::sleep_for(down);
      rig.wanem->Signal(SIGUSR1);  // up
      std::this_thread::sleep_for(every);
    }
  };
}

// One connection to the upstream, so a black hole or a reset hits every fetch in flight.
const char* kOneConnection = "[fetch]\nconnections = 1\nmax_connections = 1\n";

}  // namespace

TEST_CASE("link faults: connections reset every 2 MiB, the epoch is exact", "[integration][faults][wanem]") {
  if (!HaveWanem()) return;
  // One connection: every 2 MiB of the 16 MiB kills it with all the fetches it carries.
  JobRig rig(4, 256, 16 << 10, {"--rtt-ms", "4", "--reset-every-mib", "2"}, kOneConnection);
  RequireExactEpoch(rig, Nothing);
  CHECK(rig.WanemCounter("resets") >= 4);
}

TEST_CASE("link faults: connections stall for a second at random, the epoch is exact",
          "[integration][faults][wanem]") {
  if (!HaveWanem()) return;
  JobRig rig(4, 256, 16 << 10, {"--rtt-ms", "4", "--stall-prob", "0.02", "--stall-ms", "1000", "--seed", "5"});
  RequireExactEpoch(rig, Nothing);
  CHECK(rig.WanemCounter("stalls") >= 1);
}

TEST_CASE("link faults: the link goes down twice for 2 s mid-epoch, the epoch is exact",
          "[integration][faults][wanem]") {
  if (!HaveWanem()) return;
  // 40 Mbit/s: the 16 MiB take ~3.5 s to cross, so the link goes down while fetches run.
  JobRig rig(4, 256, 16 << 10, {"--rtt-ms", "4", "--rate-mbit", "40"});
  RequireExactEpoch(rig, Flaps(rig, 2, std::chrono::seconds(2), std::chrono::milliseconds(500)));
  CHECK(rig.WanemCounter("refused") + rig.WanemCounter("resets") >= 1);
}

TEST_CASE("link faults: the connection becomes a black hole after 10 MiB, the node notices and the "
          "epoch is exact",
          "[integration][faults][wanem]") {
  if (!HaveWanem()) return;
  JobRig rig(4, 256, 16 << 10, {"--rtt-ms", "4", "--blackhole-after-mib", "10"}, kOneConnection);
  const auto t0 = Clock::now();
  RequireExactEpoch(rig, Nothing);
  // Keepalive (10 s + 5 s) ends each dead connection; a stuck epoch would wait for fetch.timeout
  // (60 s) on every one.
  CHECK(Clock::now() - t0 < std::chrono::seconds(90));
  CHECK(rig.WanemCounter("connections") >= 2);
}

TEST_CASE("link faults: a link that stays down ends the trainers' reads with Unavailable naming the "
          "upstream within outage_timeout, the daemon stays up, and reads work again once it is back",
          "[integration][faults][wanem]") {
  if (!HaveWanem()) return;
  // 32 MiB at 40 Mbit/s (~7 s): the link dies with most of the epoch not yet fetched.
  JobRig rig(4, 512, 16 << 10, {"--rtt-ms", "4", "--rate-mbit", "40"}, "[fetch]\noutage_timeout = \"3s\"\n");
  Rank ranks[2];
  std::thread t0 = rig.Reader(0, &ranks[0]), t1 = rig.Reader(1, &ranks[1]);
  REQUIRE(Eventually([&] { return ranks[0].batches >= 1 && ranks[1].batches >= 1; }, std::chrono::seconds(30)));
  rig.wanem->Signal(SIGUSR1);  // down, and it stays down
  const auto down_at = Clock::now();
  t0.join();
  t1.join();
  const auto took = Clock::now() - down_at;
  INFO("node log:\n" << LogTail(rig.node->log));
  for (const Rank& r : ranks) {
    INFO(r.error.ToString());
    CHECK(r.error.code() == StatusCode::kUnavailable);
    CHECK_THAT(r.error.message(), Catch::Contains("127.0.0.1:" + std::to_string(rig.wanem_port)) &&
                                      Catch::Contains("has not answered for"));
    CHECK(r.ids.size() < rig.samples() / 2);
  }
  // outage_timeout (3 s) + a probe period + the reads in flight, never the 60 s call deadline.
  CHECK(took < std::chrono::seconds(20));
  CHECK(rig.node->proc->Running());
  CHECK(Ready(rig.node->metrics_port, /*degraded_is_up=*/true));
  CHECK_FALSE(Ready(rig.node->metrics_port));  // degraded: the upstream check fails

  rig.wanem->Signal(SIGUSR1);  // back
  REQUIRE(Eventually([&] { return Ready(rig.node->metrics_port); }, std::chrono::seconds(15)));
  RequireExactEpoch(rig, Nothing);
}

TEST_CASE("link faults (long): resets every 1 MiB, stalls of 2 s, 6 flaps and black holes over a 128 MiB "
          "epoch, each exact",
          "[integration][faults][wanem][slow]") {
  if (!HaveWanem()) return;
  SECTION("resets") {
    JobRig rig(8, 512, 32 << 10, {"--rtt-ms", "20", "--reset-every-mib", "1"});
    RequireExactEpoch(rig, Nothing);
    CHECK(rig.WanemCounter("resets") >= 64);
  }
  SECTION("stalls") {
    JobRig rig(8, 512, 32 << 10, {"--rtt-ms", "20", "--stall-prob", "0.01", "--stall-ms", "2000"});
    RequireExactEpoch(rig, Nothing);
    CHECK(rig.WanemCounter("stalls") >= 1);
  }
  SECTION("flaps") {
    JobRig rig(8, 512, 32 << 10, {"--rtt-ms", "20", "--rate-mbit", "100"});
    RequireExactEpoch(rig, Flaps(rig, 6, std::chrono::seconds(3), std::chrono::seconds(1)));
  }
  SECTION("black holes") {
    JobRig rig(8, 512, 32 << 10, {"--rtt-ms", "20", "--blackhole-after-mib", "8"});
    RequireExactEpoch(rig, Nothing);
  }
}
