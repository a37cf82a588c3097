// The real Prometheus server (Debian's `prometheus`) scrapes a running shardcached on
// loopback every second; the test reads the daemon's metrics back through Prometheus's HTTP
// query API — proof that /metrics is valid exposition format end to end. And Prometheus's own
// linter, `promtool check metrics`, passes the real /metrics of an origin and a node that
// served, whose every family exists from start.
#include <signal.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include "common/fs.h"
#include "integration/daemon_probe.h"
#include "testing/datasets.h"
#include "testing/eventually.h"
#include "testing/local_conn.h"
#include "testing/process.h"
#include "testing/temp_dir.h"

namespace shardcache::testing {
namespace {

using namespace std::chrono_literals;

// Runs an instant query; returns the first result's value, or "" while there is none.
std::string Query(int prom_port, const std::string& promql) {
  httplib::Client cli("127.0.0.1", prom_port);
  cli.set_read_timeout(5s);
  auto res = cli.Get("/api/v1/query", httplib::Params{{"query", promql}}, httplib::Headers{});
  if (!res || res->status != 200) return "";
  const auto j = nlohmann::json::parse(res->body, nullptr, false);
  if (j.is_discarded() || j["status"] != "success" || j["data"]["result"].empty()) return "";
  return j["data"]["result"][0]["value"][1].get<std::string>();
}

TEST_CASE("Prometheus scrapes the daemon and serves its metrics back", "[deploy][prometheus]") {
  if (RunCommand("command -v prometheus") != 0) FAIL("the prometheus binary is missing: run deploy/setup.sh");
  TempDir dir;
  REQUIRE(MakeDirs(dir / "datasets").ok());
  REQUIRE(MakeRecordsDataset(dir / "datasets", "tokens", 1, 16, 1024, 16 << 10).ok());
  const int metrics_port = FreePort(), prom_port = FreePort();
  REQUIRE(WriteFileAtomic(dir / "shardcached.toml",
                          "upstream = \"file://" + (dir / "datasets") + "\"\n[listen]\nsocket = \"\"\nmetrics = \"127.0.0.1:" +
                              std::to_string(metrics_port) + "\"\n").ok());
  Process daemon({BinPath("shardcached"), "--config", dir / "shardcached.toml"}, dir / "daemon.log");
  REQUIRE(WaitForPort(metrics_port));

  REQUIRE(WriteFileAtomic(dir / "prometheus.yml",
                          "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
                          "scrape_configs:\n  - job_name: shardcached\n    static_configs:\n"
                          "      - targets: ['127.0.0.1:" + std::to_string(metrics_port) + "']\n").ok());
  Process prometheus({"prometheus", "--config.file=" + (dir / "prometheus.yml"),
                      "--storage.tsdb.path=" + (dir / "tsdb"),
                      "--web.listen-address=127.0.0.1:" + std::to_string(prom_port),
                      "--log.level=warn"},
                     dir / "prometheus.log");
  auto log = [&] {
    auto t = ReadFileToString(dir / "prometheus.log");
    return t.ok() ? *t : std::string("(no log)");
  };
  if (!WaitForPort(prom_port, 30s)) FAIL("prometheus did not listen; its log:\n" << log());

  // The scrape target is up and a shardcache metric arrived through Prometheus.
  std::string up, ready, rss;
  const auto deadline = std::chrono::steady_clock::now() + 30s;
  while (std::chrono::steady_clock::now() < deadline && (up != "1" || ready != "1" || rss.empty())) {
    std::this_thread::sleep_for(250ms);
    up = Query(prom_port, "up{job=\"shardcached\"}");
    ready = Query(prom_port, "shardcache_ready{job=\"shardcached\"}");
    rss = Query(prom_port, "shardcache_process_resident_bytes");
  }
  std::printf("prometheus: up=%s shardcache_ready=%s shardcache_process_resident_bytes=%s\n", up.c_str(),
              ready.c_str(), rss.c_str());
  INFO("prometheus log:\n" << log());
  CHECK(up == "1");
  CHECK(ready == "1");
  REQUIRE_FALSE(rss.empty());
  CHECK(std::stod(rss) > 1e6);
  prometheus.Signal(SIGTERM);
  prometheus.Wait(10s);
}

// The families each role exposes from the moment it is ready, before any event.
const std::vector<std::string> kProcessFamilies = {
    "shardcache_ready", "shardcache_admin_requests_total", "shardcache_process_resident_bytes",
    "shardcache_process_virtual_bytes", "shardcache_process_cpu_seconds_total", "shardcache_process_uptime_seconds",
    "shardcache_process_open_fds", "shardcache_process_threads",
    "shardcache_process_heap_in_use_bytes", "shardcache_process_heap_free_bytes"};
const std::vector<std::string> kOriginFamilies = {
    "shardcache_origin_requests_total", "shardcache_origin_chunks_total", "shardcache_origin_payload_bytes_total",
    "shardcache_origin_wire_bytes_total", "shardcache_origin_compression_ratio",
    "shardcache_checkpoint_received_bytes_total", "shardcache_checkpoint_commits_total",
    "shardcache_checkpoint_refused_total"};
const std::vector<std::string> kFileUpstreamFamilies = {"shardcache_file_read_bytes_total",
                                                        "shardcache_origin_checksum_failures_total"};
const std::vector<std::string> kNodeFamilies = {
    "shardcache_cache_served_bytes_total", "shardcache_cache_hits_total", "shardcache_cache_misses_total",
    "shardcache_cache_upstream_fetched_chunks_total", "shardcache_cache_evicted_segments_total",
    "shardcache_cache_evicted_bytes_total", "shardcache_cache_checksum_failures_total",
    "shardcache_cache_enospc_passthrough_total", "shardcache_cache_admission_declined_total",
    "shardcache_cache_written_bytes_total", "shardcache_cache_unstored_chunks_total",
    "shardcache_cache_nvme_errors_total", "shardcache_cache_nvme_healthy", "shardcache_cache_nvme_used_bytes",
    "shardcache_cache_nvme_budget_bytes", "shardcache_cache_dram_used_bytes", "shardcache_cache_dram_budget_bytes",
    "shardcache_cache_index_memory_bytes",
    "shardcache_cache_nvme_read_seconds", "shardcache_upstream_wire_bytes_total",
    "shardcache_upstream_payload_bytes_total", "shardcache_upstream_chunks_total", "shardcache_upstream_streams_total",
    "shardcache_upstream_retries_total", "shardcache_upstream_checksum_failures_total",
    "shardcache_upstream_fetches_in_flight", "shardcache_upstream_stream_limit",
    "shardcache_upstream_goodput_bytes_per_second", "shardcache_upstream_up", "shardcache_serve_batches_total",
    "shardcache_serve_bytes_total", "shardcache_serve_stall_seconds_total", "shardcache_serve_chunk_reads_total",
    "shardcache_serve_warm_reads_total", "shardcache_serve_refused_connections_total", "shardcache_serve_connections",
    "shardcache_serve_next_wait_seconds", "shardcache_serve_batch_assembly_seconds",
    "shardcache_checkpoint_pending_bytes", "shardcache_checkpoint_uploaded_bytes_total",
    "shardcache_checkpoint_save_seconds_total", "shardcache_checkpoint_upload_seconds_total"};

void RequireFamilies(const std::string& metrics, const std::vector<std::string>& families) {
  for (const auto& f : families) {
    INFO("family " << f);
    CHECK(metrics.find("\n# TYPE " + f + " ") != std::string::npos);
  }
}

// `promtool check metrics` on the exposition; its complaints when it has any.
void RequirePromtoolPasses(const TempDir& dir, const std::string& name, const std::string& metrics) {
  const std::string path = dir / (name + ".metrics");
  REQUIRE(WriteFileAtomic(path, metrics).ok());
  std::string out;
  const int rc = RunCommand("promtool check metrics < " + path, &out);
  INFO(name << " /metrics:\n" << metrics << "\npromtool says:\n" << out);
  CHECK(rc == 0);
}

std::string ConfigText(const std::string& upstream, const std::string& socket, int origin_port, int metrics_port,
                       const std::string& rest = "") {
  return "upstream = \"" + upstream + "\"\n[listen]\nsocket = \"" + socket + "\"\norigin = \"127.0.0.1:" +
         std::to_string(origin_port) + "\"\nmetrics = \"127.0.0.1:" + std::to_string(metrics_port) + "\"\n" + rest;
}

TEST_CASE("promtool check metrics passes the /metrics of an origin and a node that served, and every family "
          "exists from start",
          "[deploy][prometheus][promtool]") {
  if (RunCommand("command -v promtool") != 0) {
    WARN("promtool (Debian package prometheus, installed by deploy/setup.sh) is missing: metrics not linted");
    return;
  }
  TempDir dir;
  const std::string root = dir / "datasets";
  REQUIRE(MakeDirs(root).ok());
  REQUIRE(MakeRecordsDataset(root, "tokens", 2, 64, 1024, 16 << 10).ok());
  const int origin_port = FreePort(), origin_metrics = FreePort(), node_port = FreePort(), node_metrics = FreePort();
  const std::string socket = dir / "node.sock";
  REQUIRE(WriteFileAtomic(dir / "origin.toml", ConfigText("file://" + root, "", origin_port, origin_metrics)).ok());
  REQUIRE(WriteFileAtomic(dir / "node.toml",
                          ConfigText("grpc://127.0.0.1:" + std::to_string(origin_port), socket, node_port, node_metrics,
                                     "[cache]\ndir = \"" + (dir / "cache") +
                                         "\"\nsize = \"64MiB\"\nsegment_size = \"8MiB\"\n[local]\narena_size = \"8MiB\"\n"))
              .ok());
  Process origin({BinPath("shardcached"), "--config", dir / "origin.toml"}, dir / "origin.log");
  Process node({BinPath("shardcached"), "--config", dir / "node.toml"}, dir / "node.log");
  REQUIRE(Eventually([&] { return Http(origin_metrics, "/ready").first == 200; }));
  REQUIRE(Eventually([&] { return Http(node_metrics, "/ready").first == 200; }));
  INFO("node log:\n" << LogTail(dir / "node.log"));

  // From start, before any request: every family of each role, at zero.
  const std::string origin_fresh = Http(origin_metrics, "/metrics").second;
  RequireFamilies(origin_fresh, kProcessFamilies);
  RequireFamilies(origin_fresh, kOriginFamilies);
  RequireFamilies(origin_fresh, kFileUpstreamFamilies);
  const std::string node_fresh = Http(node_metrics, "/metrics").second;
  RequireFamilies(node_fresh, kProcessFamilies);
  RequireFamilies(node_fresh, kOriginFamilies);
  RequireFamilies(node_fresh, kNodeFamilies);

  // Serve: a trainer reads an epoch on the local socket (stall time, per dataset-and-rank
  // series), and a downstream daemon reads the dataset through the node's Origin port.
  {
    LocalConn conn(socket);
    conn.Hello(5);
    const uint64_t loader = conn.OpenLoader("tokens", 16, /*ring=*/false).loader_id();
    for (;;) {
      v1::LocalRequest req;
      req.mutable_next_batch()->set_loader_id(loader);
      auto r = conn.Call(req);
      REQUIRE(r.code() == 0);
      if (r.next_batch().end_of_epoch()) break;
      v1::LocalRequest rel;
      rel.mutable_release_batch()->set_loader_id(loader);
      rel.mutable_release_batch()->set_slot(r.next_batch().slot());
      rel.mutable_release_batch()->set_no_reply(true);
      conn.Send(rel);
    }
  }
  std::string out;
  REQUIRE(RunCommand(BinPath("shardctl") + " fetch --timeout 30 --upstream grpc://127.0.0.1:" +
                         std::to_string(node_port) + " tokens all " + (dir / "out"),
                     &out) == 0);
  const std::string node_served = Http(node_metrics, "/metrics").second;
  CHECK(node_served.find("shardcache_loader_stall_seconds_total{dataset=\"tokens\",rank=\"0\"}") != std::string::npos);
  RequirePromtoolPasses(dir, "origin", Http(origin_metrics, "/metrics").second);
  RequirePromtoolPasses(dir, "node", node_served);
}

}  // namespace
}  // namespace shardcache::testing
