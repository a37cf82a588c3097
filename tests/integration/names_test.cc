// Dataset names and re-indexing with real daemons, as a deployment runs them: an origin
// shardcached (file upstream) and a node shardcached (grpc upstream, NVMe cache, Origin port,
// local socket). A nested name ("laion/train", a dataset in a subdirectory of the origin's root)
// goes through every door an operator or trainer uses — shardctl fetch, warm and evict, a loader
// on the local socket, /status, /metrics, POST /evict — and a dataset re-indexed at the origin
// with `shardctl index` is what the next loader on the node opens.
//
// Programs come from $SHARDCACHE_BIN_DIR when set, else from this build's bin/.
#include <chrono>
#include <string>
#include <thread>

#include <catch2/catch.hpp>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include "common/fs.h"
#include "dataset/manifest.h"
#include "integration/daemon_probe.h"
#include "integration/daemons.h"
#include "testing/datasets.h"
#include "testing/local_conn.h"
#include "testing/process.h"
#include "testing/temp_dir.h"

namespace shardcache::testing {
namespace {

using namespace std::chrono_literals;

// Local protocol version these tests speak (loaders with a version in the answer).
constexpr uint32_t kProtocol = 5;

// An origin over `root` and a node in front of it with a local socket, both started.
struct OriginAndNode {
  Daemon origin, node;
  OriginAndNode(const TempDir& dir, const std::string& root)
      : origin(dir, "origin", "file://" + root, 0),
        node(dir, "node", origin.Url(), 64 << 20, 8 << 20, dir / "node.sock") {
    origin.Start();
    node.Start();
  }
  std::string Logs() const { return "origin log:\n" + LogTail(origin.log) + "\nnode log:\n" + LogTail(node.log); }
};

std::string OpenLoaderVersion(const std::string& socket, const std::string& dataset) {
  LocalConn conn(socket);
  conn.Hello(kProtocol);
  return conn.OpenLoader(dataset, 4, /*ring=*/false).version();
}

TEST_CASE("a nested dataset name is served end to end: origin → node, fetch, warm, loader, status, metrics, evict",
          "[integration][names]") {
  TempDir dir;
  const std::string root = dir / "datasets";
  auto ds = MakeRecordsDataset(root, "laion/train", 3, 64, 4096, 64 << 10);
  REQUIRE(ds.ok());
  OriginAndNode d(dir, root);
  INFO(d.Logs());

  std::string out;
  REQUIRE(FetchAll(d.node.Url(), "laion/train", dir / "out", &out) == 0);
  INFO(out);
  RequireSameShards(root + "/laion/train", dir / "out");

  REQUIRE(RunCommand(Bin("shardctl") + " warm --socket " + d.node.socket + " laion/train", &out) == 0);
  CHECK_THAT(out, Catch::Contains("warmed 'laion/train' (version " + (*ds)->version));

  CHECK(OpenLoaderVersion(d.node.socket, "laion/train") == (*ds)->version);
  const auto [mcode, metrics] = Http(d.node.metrics_port, "/metrics");
  CHECK(mcode == 200);
  CHECK_THAT(metrics, Catch::Contains("dataset=\"laion/train\""));

  auto status = nlohmann::json::parse(Http(d.node.metrics_port, "/status").second, nullptr, false);
  REQUIRE(status.is_object());
  REQUIRE(status["datasets"].size() == 1);
  CHECK(status["datasets"][0]["name"] == "laion/train");

  REQUIRE(RunCommand(Bin("shardctl") + " evict laion/train --metrics-addr " + d.node.MetricsAddr(), &out) == 0);
  CHECK_THAT(out, Catch::Contains("evicted dataset 'laion/train'"));
  CHECK(Http(d.node.metrics_port, "/evict?dataset=laion%2Ftrain", true).first == 200);
  for (const char* bad : {"a/../../etc", "laion//train", "/laion/train", "laion/.shardcache"}) {
    INFO(bad);
    CHECK(RunCommand(Bin("shardctl") + " evict '" + bad + "' --metrics-addr " + d.node.MetricsAddr(), &out) == 2);
  }
}

TEST_CASE("a dataset re-indexed at the origin with shardctl index is what the next loader on a running node opens",
          "[integration][reindex]") {
  TempDir dir;
  const std::string root = dir / "datasets";
  const std::string ds_dir = root + "/laion/train";
  auto first = MakeRecordsDataset(root, "laion/train", 2, 64, 4096, 64 << 10);
  REQUIRE(first.ok());
  OriginAndNode d(dir, root);
  INFO(d.Logs());
  REQUIRE(OpenLoaderVersion(d.node.socket, "laion/train") == (*first)->version);

  std::string out;
  // A --name that no daemon would serve is refused and leaves the dataset as it was.
  CHECK(RunCommand(Bin("shardctl") + " index " + ds_dir + " --format records --record-bytes 4KiB --name bar", &out) == 1);
  // Re-indexed with another chunk size, under its default name ('train', its last part).
  REQUIRE(RunCommand(Bin("shardctl") + " index " + ds_dir + " --format records --record-bytes 4KiB --chunk-bytes 32KiB",
                     &out) == 0);
  INFO(out);
  auto second = dataset::LoadDatasetDir(ds_dir);
  REQUIRE(second.ok());
  REQUIRE((*second)->version != (*first)->version);

  // The node revalidates a manifest at most 1 s after it last fetched it.
  const auto t0 = std::chrono::steady_clock::now();
  std::string seen;
  while (std::chrono::steady_clock::now() - t0 < 10s) {
    seen = OpenLoaderVersion(d.node.socket, "laion/train");
    if (seen == (*second)->version) break;
    std::this_thread::sleep_for(100ms);
  }
  const double took_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  CHECK(seen == (*second)->version);
  CHECK(took_s < 2.5);
}

}  // namespace
}  // namespace shardcache::testing
