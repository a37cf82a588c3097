// Real daemons chained on loopback, as a deployment runs them: an origin shardcached (file
// upstream, no cache) → a middle-tier shardcached (grpc upstream, NVMe cache, Origin service
// for downstream) → a node shardcached (grpc upstream, NVMe cache). `shardctl fetch` against
// the node's Origin port reads whole datasets; the bytes are compared with the origin's files
// and the origin's counters show what crossed the first hop. A second test kills the node
// with SIGKILL in the middle of a fill, restarts it on the same cache directory, and checks
// that everything it serves is intact and the cache stayed within its budget.
//
// Programs come from $SHARDCACHE_BIN_DIR when set (to reuse an existing build), else from
// this build's bin/.
#include <signal.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <random>
#include <thread>

#include <catch2/catch.hpp>
#include <httplib.h>

#include "common/fs.h"
#include "testing/datasets.h"
#include "testing/process.h"
#include "integration/daemon_probe.h"
#include "integration/daemons.h"
#include "testing/temp_dir.h"

namespace shardcache::testing {
namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;

uint64_t ApparentBytes(const std::string& dir) {
  std::string out;
  REQUIRE(RunCommand("du -sb " + dir, &out) == 0);
  return std::stoull(out);
}

TEST_CASE("a dataset read twice through origin → middle tier → node arrives byte-exact and crosses the first hop once",
          "[integration][tiers]") {
  TempDir dir;
  const std::string root = dir / "datasets";
  REQUIRE(MakeDirs(root).ok());
  // 4 shards × 1 MiB of incompressible records in 64 KiB chunks = 64 chunks.
  auto ds = MakeRecordsDataset(root, "recs", 4, 64, 16 << 10, 64 << 10);
  REQUIRE(ds.ok());
  const double chunks = 64, bytes = 4 << 20;

  Daemon origin(dir, "origin", "file://" + root, 0);
  origin.Start();
  Daemon middle(dir, "middle", origin.Url(), 64 << 20);
  middle.Start();
  Daemon node(dir, "node", middle.Url(), 64 << 20);
  node.Start();

  for (int pass = 1; pass <= 2; ++pass) {
    INFO("pass " << pass);
    const std::string out = dir / ("out" + std::to_string(pass));
    std::string output;
    const int rc = FetchAll(node.Url(), "recs", out, &output);
    INFO(output << "\nnode log:\n" << LogTail(node.log) << "\nmiddle log:\n" << LogTail(middle.log));
    REQUIRE(rc == 0);
    RequireSameShards(root + "/recs", out);
    // Each chunk crossed origin → middle exactly once, also after the second pass.
    CHECK(Metric(origin.metrics_port, "shardcache_origin_chunks_total") == chunks);
    CHECK(Metric(origin.metrics_port, "shardcache_origin_payload_bytes_total") == bytes);
    // ...and middle → node once: the second pass is served from the node's cache.
    CHECK(Metric(middle.metrics_port, "shardcache_origin_chunks_total") == chunks);
    CHECK(Metric(node.metrics_port, "shardcache_origin_chunks_total") == pass * chunks);
  }
}

// One kill -9 of the node in the middle of a fill, then restart, read everything, check.
void KillDuringFillAndVerify(Daemon& node, const std::string& root, const TempDir& dir, int round,
                             std::mt19937& rng, int* interrupted_rounds) {
  INFO("round " << round);
  const std::string fill_out = dir / ("fill" + std::to_string(round));
  Process fill({Bin("shardctl"), "fetch", "--timeout", "60", "--upstream", node.Url(), "recs", "all", fill_out},
               dir / ("fill" + std::to_string(round) + ".log"));
  // Kill somewhere inside the fill: after the first chunks were stored, before it is done.
  const auto until = std::chrono::steady_clock::now() +
                     std::chrono::milliseconds(std::uniform_int_distribution<int>(30, 250)(rng));
  while (std::chrono::steady_clock::now() < until && fill.Running()) std::this_thread::sleep_for(2ms);
  const bool interrupted = fill.Running();
  node.proc->Kill();  // SIGKILL + reap
  fill.Kill();        // the client would only retry against the dead node until its timeout
  UNSCOPED_INFO("fill interrupted by the kill: " << interrupted);
  if (interrupted) ++*interrupted_rounds;

  node.Start();
  const std::string out = dir / ("read" + std::to_string(round));
  std::string output;
  const int rc = FetchAll(node.Url(), "recs", out, &output);
  INFO(output << "\nnode log:\n" << LogTail(node.log));
  REQUIRE(rc == 0);  // shardctl fetch verifies each chunk's hash against the manifest
  RequireSameShards(root + "/recs", out);
  CHECK(ApparentBytes(node.cache_dir) <= node.cache_bytes);
  fs::remove_all(out);
  fs::remove_all(fill_out);
}

void KillDuringFillRounds(int rounds) {
  TempDir dir;
  const std::string root = dir / "datasets";
  REQUIRE(MakeDirs(root).ok());
  // 6 shards × 4 MiB in 64 KiB chunks = 384 chunks, 24 MiB; the node's budget of 26 MiB holds
  // two 8 MiB segments next to its index reserve, so the fill also evicts while it is killed.
  auto ds = MakeRecordsDataset(root, "recs", 6, 256, 16 << 10, 64 << 10);
  REQUIRE(ds.ok());
  Daemon origin(dir, "origin", "file://" + root, 0);
  origin.Start();
  Daemon node(dir, "node", origin.Url(), 26 << 20);
  node.Start();
  std::mt19937 rng(42);
  int interrupted_rounds = 0;
  for (int round = 1; round <= rounds; ++round) {
    KillDuringFillAndVerify(node, root, dir, round, rng, &interrupted_rounds);
  }
  // The kill has to land inside a fill at least once, or the test proves nothing about crashes.
  CHECK(interrupted_rounds > 0);
}

TEST_CASE("after kill -9 during a fill, the restarted node serves only correct chunks and keeps its budget (3 times)",
          "[integration][crash]") {
  KillDuringFillRounds(3);
}

TEST_CASE("after kill -9 during a fill, the restarted node serves only correct chunks and keeps its budget (20 times)",
          "[integration][crash][slow]") {
  KillDuringFillRounds(20);
}

}  // namespace
}  // namespace shardcache::testing
