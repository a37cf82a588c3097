// Failures an operator must hear about, with the real shardcached binary: a cache directory that
// is not the mounted disk (refused with cache.require_mount), a cache disk lost at run time, an
// upstream that cannot be reached at start or dies mid-epoch, and a segment_size that would
// store nothing. Each shows on /ready, /status and a metric, logs ONE line per change, and the
// daemon keeps serving what it can.
#include <signal.h>

#include <chrono>
#include <filesystem>
#include <sstream>
#include <thread>

#include <catch2/catch.hpp>
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
namespace fs = std::filesystem;

// Lines of a log file containing `text`.
int CountLines(const std::string& log, const std::string& text) {
  auto t = ReadFileToString(log);
  if (!t.ok()) return 0;
  std::istringstream in(*t);
  int n = 0;
  for (std::string line; std::getline(in, line);) n += line.find(text) != std::string::npos;
  return n;
}

nlohmann::json StatusOf(int port) { return nlohmann::json::parse(Http(port, "/status").second, nullptr, false); }

// A directory with one records dataset "tokens" (4 shards × 256 KiB in 16 KiB chunks) and the
// config files of the daemons a test starts.
struct Fixture {
  TempDir dir;
  std::string root = dir / "datasets";
  Fixture() {
    REQUIRE(MakeDirs(root).ok());
    REQUIRE(MakeRecordsDataset(root, "tokens", 4, 64, 4096, 16 << 10).ok());
  }
  std::string Write(const std::string& name, const std::string& text) {
    REQUIRE(WriteFileAtomic(dir / name, text).ok());
    return dir / name;
  }
  // An origin: file upstream, Origin service on `origin_port`, no cache.
  std::string OriginConfig(int origin_port, int metrics_port) {
    return Write("origin.toml", "upstream = \"file://" + root + "\"\n[listen]\norigin = \"127.0.0.1:" +
                                    std::to_string(origin_port) + "\"\nsocket = \"\"\nmetrics = \"127.0.0.1:" +
                                    std::to_string(metrics_port) + "\"\n");
  }
};

std::string Addr(int port) { return "127.0.0.1:" + std::to_string(port); }

TEST_CASE("with cache.require_mount, a cache.dir that is not a mount point is refused and a missing one not created",
          "[deploy][loud]") {
  Fixture f;
  REQUIRE(MakeDirs(f.dir / "cache").ok());
  auto config = [&](const std::string& cache_dir) {
    return f.Write("node.toml", "upstream = \"file://" + f.root + "\"\n[listen]\nsocket = \"\"\nmetrics = \"" +
                                    Addr(FreePort()) + "\"\n[cache]\ndir = \"" + cache_dir +
                                    "\"\nsize = \"64MiB\"\nsegment_size = \"8MiB\"\nrequire_mount = true\n");
  };
  std::string out;
  CHECK(RunCommand(Bin("shardcached") + " --config " + config(f.dir / "cache"), &out) == 1);
  INFO(out);
  CHECK_THAT(out, Catch::Contains("cache.dir " + (f.dir / "cache")) && Catch::Contains("cache.require_mount"));
  out.clear();
  CHECK(RunCommand(Bin("shardcached") + " --config " + config(f.dir / "absent"), &out) == 1);
  CHECK_THAT(out, Catch::Contains("does not exist") && Catch::Contains("mount the cache disk at " + (f.dir / "absent")));
  CHECK_FALSE(fs::exists(f.dir / "absent"));
}

TEST_CASE("--check refuses a segment_size that holds fewer than two default chunks", "[deploy][loud]") {
  Fixture f;
  const std::string cfg = f.Write("node.toml", "upstream = \"file://" + f.root + "\"\n[cache]\nsegment_size = \"4MiB\"\n");
  std::string out;
  CHECK(RunCommand(Bin("shardcached") + " --check --config " + cfg, &out) == 2);
  CHECK_THAT(out, Catch::Contains("cache.segment_size: 4.00 MiB must be at least 8.00 MiB"));
}

TEST_CASE("a cache disk lost at run time shows on /ready, /status and the metrics, logs once each way, and reads go on",
          "[deploy][loud][disk]") {
  Fixture f;
  const int origin_port = FreePort(), metrics_port = FreePort();
  const std::string cache_dir = f.dir / "cache";
  const std::string cfg = f.Write(
      "node.toml", "upstream = \"file://" + f.root + "\"\n[listen]\norigin = \"" + Addr(origin_port) +
                       "\"\nsocket = \"\"\nmetrics = \"" + Addr(metrics_port) + "\"\n[cache]\ndir = \"" + cache_dir +
                       "\"\nsize = \"64MiB\"\nsegment_size = \"8MiB\"\nmemory_size = \"0\"\nmin_free = \"0\"\n");
  const std::string log = f.dir / "node.log";
  Process node({Bin("shardcached"), "--config", cfg}, log);
  REQUIRE(Eventually([&] { return Http(metrics_port, "/ready").first == 200; }));
  INFO("node log:\n" << LogTail(log));
  const std::string fetch = Bin("shardctl") + " fetch --timeout 30 --upstream grpc://" + Addr(origin_port) +
                            " tokens all " + (f.dir / "out");
  std::string out;
  REQUIRE(RunCommand(fetch, &out) == 0);  // fills the cache
  CHECK(Metric(metrics_port, "shardcache_cache_nvme_healthy") == 1);

  fs::rename(cache_dir, f.dir / "moved");  // the disk is gone from under the daemon
  REQUIRE(Eventually([&] { return Http(metrics_port, "/ready").first == 503; }, 10s));
  const auto [code, body] = Http(metrics_port, "/ready");
  CHECK_THAT(body, Catch::StartsWith("degraded\n") && Catch::Contains("cache_disk: " + cache_dir) &&
                       Catch::Contains("gone"));
  CHECK(Metric(metrics_port, "shardcache_cache_nvme_healthy") == 0);
  const auto st = StatusOf(metrics_port);
  CHECK(st["health"] == "degraded");
  REQUIRE(st["problems"].size() == 1);
  CHECK_THAT(st["problems"][0].get<std::string>(), Catch::StartsWith("cache_disk: "));
  CHECK(st["tiers"][0]["healthy"] == false);
  out.clear();
  CHECK(RunCommand(Bin("shardctl") + " status --metrics-addr " + Addr(metrics_port), &out) == 1);
  CHECK_THAT(out, Catch::Contains("health    degraded") && Catch::Contains("problem   cache_disk: "));
  // A probe that does not care about the disk passes.
  CHECK(Http(metrics_port, "/ready?exclude=cache_disk").first == 200);
  CHECK(Http(metrics_port, "/ready?exclude=disk").first == 400);

  // Reads go on, byte for byte, and the log does not fill up.
  fs::remove_all(f.dir / "out");
  REQUIRE(RunCommand(fetch, &out) == 0);
  std::this_thread::sleep_for(2500ms);
  CHECK(CountLines(log, "cache disk " + cache_dir) == 1);

  fs::rename(f.dir / "moved", cache_dir);
  REQUIRE(Eventually([&] { return Http(metrics_port, "/ready").first == 200; }, 10s));
  CHECK(Metric(metrics_port, "shardcache_cache_nvme_healthy") == 1);
  CHECK(CountLines(log, "cache disk " + cache_dir + ": usable again") == 1);
  CHECK(CountLines(log, "cache disk " + cache_dir) == 2);
  node.Signal(SIGTERM);
  CHECK(node.Wait(30s) == 0);
}

TEST_CASE("an upstream that cannot be reached at start shows on /ready, /status and shardcache_upstream_up, "
          "logged once, until it answers",
          "[deploy][loud][upstream]") {
  Fixture f;
  const int upstream_port = FreePort(), metrics_port = FreePort(), origin_metrics = FreePort();
  const std::string cfg = f.Write(
      "node.toml", "upstream = \"grpc://" + Addr(upstream_port) + "\"\n[listen]\nsocket = \"\"\nmetrics = \"" +
                       Addr(metrics_port) + "\"\n[cache]\ndir = \"" + (f.dir / "cache") +
                       "\"\n[fetch]\noutage_timeout = \"3s\"\n");
  const std::string log = f.dir / "node.log";
  Process node({Bin("shardcached"), "--config", cfg}, log);
  const std::string unreachable = "upstream " + Addr(upstream_port) + " is unreachable";
  REQUIRE(Eventually([&] { return CountLines(log, unreachable) > 0; }));
  INFO("node log:\n" << LogTail(log));
  CHECK(Http(metrics_port, "/ready").first == 503);
  CHECK(Metric(metrics_port, "shardcache_upstream_up") == 0);
  auto st = StatusOf(metrics_port);
  CHECK(st["health"] == "degraded");
  CHECK(st["upstream"]["up"] == false);
  CHECK_FALSE(st["upstream"]["last_error"].get<std::string>().empty());
  // A tier that should serve its cache whatever the upstream does probes with exclude=upstream.
  CHECK(Http(metrics_port, "/ready?exclude=upstream").first == 200);
  std::this_thread::sleep_for(3s);  // several probes
  CHECK(CountLines(log, unreachable) == 1);

  // The upstream comes up on that port: the node is ready within a probe or two.
  Process origin({Bin("shardcached"), "--config", f.OriginConfig(upstream_port, origin_metrics)}, f.dir / "origin.log");
  REQUIRE(Eventually([&] { return Http(metrics_port, "/ready").first == 200; }, 15s));
  CHECK(Metric(metrics_port, "shardcache_upstream_up") == 1);
  // /status also lists the upstream's datasets, with a bound: on a loaded machine the first
  // listing after the upstream came up can miss it (health "degraded", datasets_error).
  CHECK(Eventually([&] { return StatusOf(metrics_port)["health"] == "ok"; }, 15s));
  CHECK(CountLines(log, "upstream " + Addr(upstream_port) + " answers again") == 1);
}

TEST_CASE("a trainer whose upstream stops answering mid-epoch gets Unavailable naming it within fetch.outage_timeout",
          "[deploy][loud][upstream]") {
  Fixture f;
  const int origin_port = FreePort(), origin_metrics = FreePort(), metrics_port = FreePort();
  const std::string socket = f.dir / "node.sock";
  // No cache and no prefetch: every batch needs the upstream.
  const std::string cfg = f.Write(
      "node.toml", "upstream = \"grpc://" + Addr(origin_port) + "\"\n[listen]\nsocket = \"" + socket +
                       "\"\nmetrics = \"" + Addr(metrics_port) + "\"\n[cache]\nsize = \"0\"\nmemory_size = \"0\"\n"
                       "[fetch]\noutage_timeout = \"3s\"\nprefetch = \"0\"\n[local]\narena_size = \"8MiB\"\n");
  Process origin({Bin("shardcached"), "--config", f.OriginConfig(origin_port, origin_metrics)}, f.dir / "origin.log");
  REQUIRE(WaitForPort(origin_port));
  const std::string log = f.dir / "node.log";
  Process node({Bin("shardcached"), "--config", cfg}, log);
  REQUIRE(Eventually([&] { return Http(metrics_port, "/ready").first == 200; }));
  INFO("node log:\n" << LogTail(log));

  LocalConn conn(socket);
  conn.Hello(5);
  const uint64_t loader = conn.OpenLoader("tokens", 16, /*ring=*/false).loader_id();
  auto next = [&] {
    v1::LocalRequest req;
    req.mutable_next_batch()->set_loader_id(loader);
    req.mutable_next_batch()->set_timeout_ms(60000);
    auto r = conn.Call(req);
    if (r.code() == 0 && !r.next_batch().end_of_epoch()) {
      v1::LocalRequest rel;
      rel.mutable_release_batch()->set_loader_id(loader);
      rel.mutable_release_batch()->set_slot(r.next_batch().slot());
      rel.mutable_release_batch()->set_no_reply(true);
      conn.Send(rel);
    }
    return r;
  };
  REQUIRE(next().code() == 0);

  // Mid-epoch the origin hangs: its connections stay open and nothing comes back, as on a
  // blackholed link. Only keepalive would notice, after 15 s; the bound ends the wait sooner.
  origin.Signal(SIGSTOP);
  const auto stopped = std::chrono::steady_clock::now();
  v1::LocalResponse r;
  do {
    r = next();  // batches assembled before the hang come first
  } while (r.code() == 0 && std::chrono::steady_clock::now() - stopped < 20s);
  const double waited_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - stopped).count();
  INFO("waited " << waited_s << " s: " << r.message());
  CHECK(r.code() == static_cast<uint32_t>(StatusCode::kUnavailable));
  CHECK_THAT(r.message(), Catch::Contains("upstream " + Addr(origin_port)) && Catch::Contains("last error"));
  CHECK(waited_s < 3 + 3);  // the bound, plus the probe cadence and a loaded machine's slack
  // While the outage goes on, the next read fails at once instead of waiting again.
  const auto t0 = std::chrono::steady_clock::now();
  CHECK(next().code() == static_cast<uint32_t>(StatusCode::kUnavailable));
  CHECK(std::chrono::steady_clock::now() - t0 < 2s);
  CHECK(Http(metrics_port, "/ready").first == 503);
  CHECK(Metric(metrics_port, "shardcache_upstream_up") == 0);
  // Retries are debug lines: for the whole outage one error, and at most one warning (the first
  // failed attempt's; a silent upstream fails no attempt before the probe finds it out).
  CHECK(CountLines(log, "upstream " + Addr(origin_port) + ": ") <= 1);  // "...: <error>; retrying"
  CHECK(CountLines(log, "upstream " + Addr(origin_port) + " is unreachable") == 1);
  CHECK(CountLines(log, "retrying shard") == 0);

  // The origin answers again: the same loader reads on.
  origin.Signal(SIGCONT);
  const bool back = Eventually([&] { return Http(metrics_port, "/ready").first == 200; }, 15s);
  INFO("node log after SIGCONT:\n" << LogTail(log));
  REQUIRE(back);
  // The pipeline reports a failed batch once, and the assembly retried during the outage
  // failed too: at most that one stale error, then batches again.
  auto again = next();
  if (again.code() != 0) again = next();
  CHECK(again.code() == 0);
}

}  // namespace
}  // namespace shardcache::testing
