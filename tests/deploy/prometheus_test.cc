// The real Prometheus server (Debian's `prometheus`) scrapes a running shardcached on
// loopback every second; the test reads the daemon's metrics back through Prometheus's HTTP
// query API — proof that /metrics is valid exposition format end to end.
#include <signal.h>

#include <chrono>
#include <thread>

#include <catch2/catch.hpp>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include "common/fs.h"
#include "testing/datasets.h"
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

}  // namespace
}  // namespace shardcache::testing
