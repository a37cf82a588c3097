// A peer group of real node daemons on loopback (daemon/upstream/peer_group.h): four nodes
// whose [peers] lists all four, each reading a whole dataset through its Origin port with
// `shardctl fetch` (a downstream reader, so the node routes chunks to their owners), all behind
// one origin reached through wanem (the long link). The origin's counters show what crossed the
// long link; the bytes are compared with the origin's files. A member killed with SIGKILL
// mid-epoch costs the others nothing but time, and rejoins when restarted. A member list from
// DNS (a hosts file we control, in a user + mount namespace) follows the file live.
#include <signal.h>

#include <chrono>
#include <fstream>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include "common/fs.h"
#include "integration/daemon_probe.h"
#include "integration/daemons.h"
#include "testing/datasets.h"
#include "testing/eventually.h"
#include "testing/process.h"
#include "testing/temp_dir.h"

namespace shardcache::testing {
namespace {

using namespace std::chrono_literals;

// 4 shards x 4 MiB of incompressible records in 64 KiB chunks: 256 chunks, 16 MiB.
constexpr int kShards = 4;
constexpr double kChunks = 256;

struct Group {
  TempDir dir;
  std::string root = dir / "datasets";
  std::unique_ptr<Daemon> origin;
  std::unique_ptr<Process> wanem;
  int wanem_port = FreePort();
  std::vector<std::unique_ptr<Daemon>> nodes;

  explicit Group(int n, const std::string& dataset = "recs") {
    REQUIRE(MakeDirs(root).ok());
    REQUIRE(MakeRecordsDataset(root, dataset, kShards, 256, 16 << 10, 64 << 10).ok());
    origin = std::make_unique<Daemon>(dir, "origin", "file://" + root, 0);
    origin->Start();
    // The long link: 10 ms, 400 Mbit/s.
    wanem = std::make_unique<Process>(
        std::vector<std::string>{"/usr/bin/python3", WanemPath(), "--listen", "127.0.0.1:" + std::to_string(wanem_port),
                                 "--upstream", "127.0.0.1:" + std::to_string(origin->origin_port), "--ready-file",
                                 dir / "wanem.ready", "--rtt-ms", "10", "--rate-mbit", "400"},
        dir / "wanem.log");
    REQUIRE(WaitForFile(dir / "wanem.ready"));
    const std::string upstream = "grpc://127.0.0.1:" + std::to_string(wanem_port);
    for (int i = 0; i < n; ++i) {
      nodes.push_back(std::make_unique<Daemon>(dir, "node" + std::to_string(i), upstream, 64 << 20));
    }
    std::string members;
    for (const auto& node : nodes) {
      members += (members.empty() ? "\"" : ", \"") + std::string("127.0.0.1:") + std::to_string(node->origin_port) + "\"";
    }
    for (const auto& node : nodes) {
      node->AppendConfig("[peers]\nmembers = [" + members + "]\ntimeout = \"5s\"\n");
      node->Start();
    }
  }

  std::string Member(int i) const { return "127.0.0.1:" + std::to_string(nodes[i]->origin_port); }
  double OriginChunks() const { return Metric(origin->metrics_port, "shardcache_origin_chunks_total"); }
  // Hedges of the members' fetches over their own upstream links (to the origin).
  double UpstreamHedges() const {
    double n = 0;
    for (const auto& node : nodes) n += Metric(node->metrics_port, "shardcache_upstream_hedges_total");
    return n;
  }
};

// `shardctl fetch` of the whole dataset through node i, as a process.
std::unique_ptr<Process> StartFetch(const Group& g, int i, const std::string& dataset, const std::string& out) {
  return std::make_unique<Process>(std::vector<std::string>{Bin("shardctl"), "fetch", "--timeout", "120", "--upstream",
                                                            g.nodes[i]->Url(), dataset, "all", out},
                                   g.dir / ("fetch" + std::to_string(i) + ".log"));
}

int Wait(Process& p) { return p.Wait(std::chrono::seconds(120)); }

bool HaveWanem() {
  if (WanemPath().empty()) {
    WARN("../shared/tools/wanem.py not found; peer group tests skipped");
    return false;
  }
  return true;
}

TEST_CASE("peer group: 4 nodes read a whole dataset byte-exact and the origin serves each chunk once",
          "[integration][peers]") {
  if (!HaveWanem()) return;
  Group g(4);
  std::vector<std::unique_ptr<Process>> fetches;
  for (int i = 0; i < 4; ++i) fetches.push_back(StartFetch(g, i, "recs", g.dir / ("out" + std::to_string(i))));
  for (int i = 0; i < 4; ++i) {
    INFO("node " << i << " fetch log:\n" << LogTail(g.dir / ("fetch" + std::to_string(i) + ".log")) << "\nnode log:\n"
                 << LogTail(g.nodes[i]->log));
    REQUIRE(Wait(*fetches[i]) == 0);
    RequireSameShards(g.root + "/recs", g.dir / ("out" + std::to_string(i)));
  }
  // Each chunk once, but for the copies hedges asked for: on a starved CPU (sanitizer builds on
  // two cores) a stream can look stuck, and its hedge fetches the chunk again as up to 8 block
  // ranges (GrpcSource::kStripes; each one message at the origin, as a stuck range's hedge is).
  const double hedges = g.UpstreamHedges();
  INFO(hedges << " hedges");
  if (hedges == 0) {
    CHECK(g.OriginChunks() == kChunks);
  } else {
    CHECK(g.OriginChunks() >= kChunks);
    CHECK(g.OriginChunks() <= kChunks + 8 * hedges);
  }
  // Each node got chunks from every other member, and fetched its own share over its own
  // upstream link. Whether the node's own reads find that share already cached (because a peer
  // asked for it first) depends on timing, so "self" is judged by the upstream counter.
  for (int i = 0; i < 4; ++i) {
    for (int j = 0; j < 4; ++j) {
      INFO("node " << i << ", member " << j);
      if (j == i) {
        CHECK(Metric(g.nodes[i]->metrics_port, "shardcache_upstream_chunks_total") > 0);
      } else {
        CHECK(Metric(g.nodes[i]->metrics_port, "shardcache_peer_chunks_total{member=\"" + g.Member(j) + "\"}") > 0);
      }
    }
    CHECK(Metric(g.nodes[i]->metrics_port, "shardcache_peer_errors_total") == 0);
  }
  // The operator's view of node 0: every member with its share in `shardctl status`, and where
  // its bytes came from in `shardctl top`.
  const std::string admin = " --metrics-addr 127.0.0.1:" + std::to_string(g.nodes[0]->metrics_port);
  std::string status, top;
  REQUIRE(RunCommand(Bin("shardctl") + " status" + admin, &status) == 0);
  INFO("shardctl status:\n" << status << "\nnode 0 log:\n" << LogTail(g.nodes[0]->log));
  CHECK(Metric(g.nodes[0]->metrics_port, "shardcache_peer_errors_total") == 0);
  CHECK(status.find("PEER") != std::string::npos);
  for (int j = 0; j < 4; ++j) CHECK(status.find(g.Member(j)) != std::string::npos);
  CHECK(status.find(" self ") != std::string::npos);
  CHECK(status.find("25.0%") != std::string::npos);
  REQUIRE(RunCommand(Bin("shardctl") + " top --once --interval 0.2" + admin, &top) == 0);
  INFO("shardctl top:\n" << top);
  CHECK(top.find("sources   local tiers") != std::string::npos);
  for (int j = 0; j < 4; ++j) CHECK(top.find(g.Member(j)) != std::string::npos);
}

TEST_CASE("peer group: a member killed with SIGKILL mid-epoch; the others finish byte-exact, and it rejoins on restart",
          "[integration][peers][crash]") {
  if (!HaveWanem()) return;
  Group g(4);
  std::vector<std::unique_ptr<Process>> fetches;
  for (int i = 0; i < 4; ++i) fetches.push_back(StartFetch(g, i, "recs", g.dir / ("out" + std::to_string(i))));
  // Kill node 3 once the group has moved some chunks, well before the epoch is done.
  REQUIRE(Eventually([&] { return g.OriginChunks() >= kChunks / 8; }, 30s));
  g.nodes[3]->proc->Kill();
  fetches[3]->Kill();
  const double at_kill = g.OriginChunks();
  INFO("origin had served " << at_kill << " of " << kChunks << " chunks at the kill");
  CHECK(at_kill < kChunks);
  for (int i = 0; i < 3; ++i) {
    INFO("node " << i << " fetch log:\n" << LogTail(g.dir / ("fetch" + std::to_string(i) + ".log")) << "\nnode log:\n"
                 << LogTail(g.nodes[i]->log));
    REQUIRE(Wait(*fetches[i]) == 0);
    RequireSameShards(g.root + "/recs", g.dir / ("out" + std::to_string(i)));
  }
  // Node 3's share came from the origin (or the next member) instead: some chunks twice at most.
  CHECK(g.OriginChunks() <= 2 * kChunks);

  // Restarted, it serves its share again without a restart of the others.
  g.nodes[3]->Start();
  const std::string member3 = "shardcache_peer_usable{member=\"" + g.Member(3) + "\"}";
  REQUIRE(Eventually([&] { return Metric(g.nodes[0]->metrics_port, member3) == 1; }, 20s));
  REQUIRE(MakeRecordsDataset(g.root, "recs2", kShards, 256, 16 << 10, 64 << 10).ok());
  auto again = StartFetch(g, 0, "recs2", g.dir / "again");
  INFO("fetch log:\n" << LogTail(g.dir / "fetch0.log") << "\nnode log:\n" << LogTail(g.nodes[0]->log));
  REQUIRE(Wait(*again) == 0);
  RequireSameShards(g.root + "/recs2", g.dir / "again");
  const std::string chunks3 = "shardcache_peer_chunks_total{member=\"" + g.Member(3) + "\"}";
  CHECK(Metric(g.nodes[0]->metrics_port, chunks3) > 0);
  CHECK(Metric(g.nodes[3]->metrics_port, "shardcache_origin_chunks_total") > 0);  // it served node 0
}

// Overwrites `path` in place (a bind mount follows the inode, not the name).
void Overwrite(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::trunc);
  f << text;
  REQUIRE(f.good());
}

// The members /status of the daemon on `metrics_port` lists, "address" or "address (self)".
std::set<std::string> StatusMembers(int metrics_port) {
  httplib::Client cli("127.0.0.1", metrics_port);
  auto res = cli.Get("/status");
  if (!res || res->status != 200) return {};
  const auto j = nlohmann::json::parse(res->body, nullptr, false);
  std::set<std::string> out;
  if (j.is_discarded() || !j.contains("peers")) return out;
  for (const auto& m : j["peers"]) {
    out.insert(m["member"].get<std::string>() + (m["self"].get<bool>() ? " (self)" : ""));
  }
  return out;
}

TEST_CASE("peer group: members from DNS (a hosts file we control) join and leave without a restart",
          "[integration][peers][dns]") {
  if (RunCommand("unshare -rm sh -c 'mount --bind /etc/hosts /etc/hosts'") != 0) {
    WARN("no unprivileged user + mount namespaces here; DNS membership test skipped");
    return;
  }
  TempDir dir;
  const std::string root = dir / "datasets";
  REQUIRE(MakeDirs(root).ok());
  REQUIRE(MakeRecordsDataset(root, "recs", kShards, 256, 16 << 10, 64 << 10).ok());
  Daemon origin(dir, "origin", "file://" + root, 0);
  origin.Start();
  // Members on three loopback addresses, one port: what a headless Service's name resolves to.
  const int port = FreePort();
  const std::string name = "members.shardcache.test";
  auto member = [&](int k) { return "127.0.0." + std::to_string(k) + ":" + std::to_string(port); };
  Daemon b(dir, "b", origin.Url(), 64 << 20), c(dir, "c", origin.Url(), 64 << 20);
  b.ListenOn("127.0.0.3", port);
  c.ListenOn("127.0.0.4", port);
  b.Start();
  c.Start();
  // Node a resolves the name through its own /etc/hosts (a bind mount in its namespaces).
  const std::string hosts = dir / "hosts", host_conf = dir / "host.conf";
  Overwrite(host_conf, "multi on\n");
  Overwrite(hosts, "127.0.0.1 localhost\n127.0.0.2 " + name + "\n127.0.0.3 " + name + "\n");
  Daemon a(dir, "a", origin.Url(), 64 << 20);
  a.ListenOn("127.0.0.2", port);
  a.AppendConfig("[peers]\ndns = \"" + name + ":" + std::to_string(port) + "\"\nself = \"" + member(2) +
                 "\"\nrefresh = \"200ms\"\n");
  a.wrapper = {"unshare", "-rm", "sh", "-c",
               "mount --bind " + hosts + " /etc/hosts && mount --bind " + host_conf +
                   " /etc/host.conf && exec \"$0\" \"$@\""};
  a.Start();
  INFO("a log:\n" << LogTail(a.log));
  CHECK(StatusMembers(a.metrics_port) == std::set<std::string>{member(2) + " (self)", member(3)});

  Overwrite(hosts, "127.0.0.1 localhost\n127.0.0.2 " + name + "\n127.0.0.3 " + name + "\n127.0.0.4 " + name + "\n");
  REQUIRE(Eventually([&] { return StatusMembers(a.metrics_port).size() == 3; }, 10s));
  std::string output;
  REQUIRE(FetchAll(a.Url(), "recs", dir / "out", &output) == 0);
  RequireSameShards(root + "/recs", dir / "out");
  for (int k : {3, 4}) {
    httplib::Client cli("127.0.0.1", a.metrics_port);
    auto res = cli.Get("/status");
    INFO("member " << member(k) << "\na status:\n" << (res ? res->body : std::string("?")));
    CHECK(Metric(a.metrics_port, "shardcache_peer_chunks_total{member=\"" + member(k) + "\"}") > 0);
  }

  Overwrite(hosts, "127.0.0.1 localhost\n127.0.0.2 " + name + "\n127.0.0.4 " + name + "\n");
  REQUIRE(Eventually([&] {
    return StatusMembers(a.metrics_port) == std::set<std::string>{member(2) + " (self)", member(4)};
  }, 10s));
}

}  // namespace
}  // namespace shardcache::testing
