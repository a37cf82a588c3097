// Real shardcached processes for the integration tests: one daemon with its own generated config
// (file or grpc upstream, NVMe cache, Origin port, admin port, optionally a local socket), and
// reading a whole dataset through one with `shardctl fetch` to compare with the origin's files.
#pragma once

#include <catch2/catch.hpp>
#include <httplib.h>

#include <chrono>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/fs.h"
#include "integration/daemon_probe.h"
#include "testing/process.h"
#include "testing/temp_dir.h"

namespace shardcache::testing {

// /ready says 200; with `degraded_is_up`, also 503 "degraded" (serving, but a check fails,
// e.g. the upstream is down) — anything but not answering or "starting".
inline bool Ready(int metrics_port, bool degraded_is_up = false) {
  httplib::Client cli("127.0.0.1", metrics_port);
  cli.set_connection_timeout(std::chrono::seconds(1));
  auto res = cli.Get("/ready");
  if (!res) return false;
  return res->status == 200 || (degraded_is_up && res->body.rfind("degraded", 0) == 0);
}

// One shardcached process with its own generated config; `socket` "" = no local service;
// `extra_toml` is appended to the config (further tables, e.g. "[fetch]\noutage_timeout = ...").
struct Daemon {
  std::string name, config, log, cache_dir, socket;
  uint64_t cache_bytes = 0;
  std::string origin_host = "127.0.0.1";
  int origin_port = FreePort();
  int metrics_port = FreePort();
  std::unique_ptr<Process> proc;
  // Runs the daemon through this command line (e.g. into a namespace), the daemon's own argv
  // appended.
  std::vector<std::string> wrapper;

  Daemon(const TempDir& dir, std::string n, const std::string& upstream, uint64_t cache_size,
         uint64_t segment_size = 8 << 20, std::string socket_path = "", const std::string& extra_toml = "")
      : name(std::move(n)), config(dir / (name + ".toml")), log(dir / (name + ".log")),
        cache_dir(dir / (name + "-cache")), socket(std::move(socket_path)), cache_bytes(cache_size) {
    const std::string text =
        "upstream = \"" + upstream + "\"\n[listen]\norigin = \"127.0.0.1:" + std::to_string(origin_port) +
        "\"\nsocket = \"" + socket + "\"\nmetrics = \"127.0.0.1:" + std::to_string(metrics_port) +
        "\"\n[cache]\ndir = \"" + cache_dir + "\"\nsize = \"" + std::to_string(cache_size) +
        "\"\nmemory_size = \"0\"\nsegment_size = \"" + std::to_string(segment_size) +
        "\"\nmin_free = \"1%\"\n[log]\nlevel = \"warn\"\n" + extra_toml;
    REQUIRE(MakeDirs(cache_dir).ok());
    REQUIRE(WriteFileAtomic(config, text).ok());
  }
  std::string Url() const { return "grpc://" + origin_host + ":" + std::to_string(origin_port); }

  // Moves the Origin service to host:port (another loopback address, say) before Start.
  void ListenOn(const std::string& host, int port) {
    auto text = ReadFileToString(config);
    REQUIRE(text.ok());
    const std::string old = "origin = \"127.0.0.1:" + std::to_string(origin_port) + "\"";
    const size_t at = text->find(old);
    REQUIRE(at != std::string::npos);
    text->replace(at, old.size(), "origin = \"" + host + ":" + std::to_string(port) + "\"");
    REQUIRE(WriteFileAtomic(config, *text).ok());
    origin_host = host;
    origin_port = port;
  }
  // Appends TOML (further tables) to the config before Start.
  void AppendConfig(const std::string& toml) {
    auto text = ReadFileToString(config);
    REQUIRE(text.ok());
    REQUIRE(WriteFileAtomic(config, *text + toml).ok());
  }
  std::string MetricsAddr() const { return "127.0.0.1:" + std::to_string(metrics_port); }

  // Starts the daemon and waits until it serves (`degraded_is_up`: also with a failing check).
  void Start(bool degraded_is_up = false) {
    std::vector<std::string> argv = wrapper;
    for (const std::string& a : {Bin("shardcached"), std::string("--config"), config}) argv.push_back(a);
    proc = std::make_unique<Process>(argv, log);
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (!Ready(metrics_port, degraded_is_up)) {
      INFO(name << " log:\n" << LogTail(log));
      REQUIRE(proc->Running());
      REQUIRE(std::chrono::steady_clock::now() < end);
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    REQUIRE(WaitForPort(origin_port, std::chrono::seconds(20), origin_host));
    if (!socket.empty()) REQUIRE(WaitForFile(socket));
  }
};

// `shardctl fetch DATASET all OUT` against `upstream`; returns the exit code.
inline int FetchAll(const std::string& upstream, const std::string& dataset, const std::string& out,
                    std::string* output) {
  return RunCommand(Bin("shardctl") + " fetch --timeout 60 --upstream " + upstream + " " + dataset +
                        " all " + out,
                    output);
}

// Every shard file of root/dataset equals out/<file>, byte for byte.
inline void RequireSameShards(const std::string& dataset_dir, const std::string& out) {
  int files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dataset_dir)) {
    if (!e.is_regular_file() || e.path().filename().string()[0] == '.') continue;
    auto want = ReadFileToString(e.path().string());
    auto got = ReadFileToString((std::filesystem::path(out) / e.path().filename()).string());
    INFO("shard " << e.path().filename());
    REQUIRE(want.ok());
    REQUIRE(got.ok());
    REQUIRE(got->size() == want->size());
    REQUIRE(*got == *want);  // not CHECK: a 4 MiB diff would flood the report
    ++files;
  }
  REQUIRE(files > 0);
}

}  // namespace shardcache::testing
