// The systemd unit, checked offline with systemd-analyze (no running systemd needed):
// `verify --man=no` on a copy whose ExecStart points at the built binary (verify refuses a
// missing ExecStart binary), and `security --offline=yes` for the exposure score.
#include <regex>
#include <sstream>

#include <catch2/catch.hpp>

#include "common/fs.h"
#include "testing/process.h"
#include "testing/temp_dir.h"

namespace shardcache::testing {
namespace {

std::string Source(const std::string& rel) {
  auto text = ReadFileToString(std::string(SC_SOURCE_DIR) + "/" + rel);
  REQUIRE(text.ok());
  return *text;
}

std::string ReplaceAll(std::string s, const std::string& from, const std::string& to) {
  for (size_t p = 0; (p = s.find(from, p)) != std::string::npos; p += to.size()) s.replace(p, from.size(), to);
  return s;
}

// Writes the unit (plus optional drop-in text appended, as systemd merges it) into `dir` with
// the installed binary path replaced by the built one.
std::string TestUnit(const TempDir& dir, const std::string& extra = "") {
  const std::string unit =
      ReplaceAll(Source("deploy/systemd/shardcached.service"), "/usr/bin/shardcached", BinPath("shardcached")) + extra;
  const std::string path = dir / "shardcached.service";
  REQUIRE(WriteFileAtomic(path, unit).ok());
  return path;
}

void RequireVerifies(const std::string& path) {
  std::string out;
  const int rc = RunCommand("systemd-analyze verify --man=no --generators=no " + path, &out);
  INFO("systemd-analyze verify said:\n" << out);
  REQUIRE(rc == 0);
  // verify exits 0 on unknown keys and bad values ("..., ignoring."): any line about the unit
  // is a defect.
  CHECK(out.find("shardcached.service") == std::string::npos);
}

double Exposure(const std::string& path) {
  std::string out;
  const int rc = RunCommand("systemd-analyze security --offline=yes --no-pager " + path, &out);
  INFO(out);
  REQUIRE(rc == 0);
  std::smatch m;
  REQUIRE(std::regex_search(out, m, std::regex(R"(Overall exposure level for shardcached\.service: ([0-9.]+))")));
  return std::stod(m[1]);
}

TEST_CASE("the systemd unit passes systemd-analyze verify", "[deploy][systemd]") {
  TempDir dir;
  RequireVerifies(TestUnit(dir));
}

TEST_CASE("the systemd unit's security exposure is at most 3.0", "[deploy][systemd]") {
  TempDir dir;
  const double score = Exposure(TestUnit(dir));
  std::printf("systemd-analyze security --offline=yes: shardcached.service exposure %.1f (limit 3.0)\n", score);
  CHECK(score <= 3.0);
}

TEST_CASE("the GPU-metrics drop-in keeps the unit valid and hardened", "[deploy][systemd]") {
  TempDir dir;
  const std::string path = TestUnit(dir, "\n" + Source("deploy/systemd/gpu-metrics.conf"));
  RequireVerifies(path);
  const double score = Exposure(path);
  std::printf("with gpu-metrics.conf drop-in: exposure %.1f\n", score);
  CHECK(score <= 3.0);
}

TEST_CASE("the unit asks for what the daemon needs", "[deploy][systemd]") {
  const std::string unit = Source("deploy/systemd/shardcached.service");
  for (const char* line : {"Type=notify", "WatchdogSec=", "RuntimeDirectory=shardcache", "StateDirectory=shardcache",
                           "CacheDirectory=shardcache", "LimitMEMLOCK=infinity", "ProtectSystem=strict",
                           "ProtectHome=yes", "PrivateTmp=yes", "NoNewPrivileges=yes",
                           "RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6",
                           "SystemCallFilter=@system-service io_uring_setup io_uring_enter io_uring_register",
                           "ExecReload=/bin/kill -HUP $MAINPID", "RestartPreventExitStatus=2",
                           "PrivateMounts=yes"}) {
    INFO(line);
    CHECK(unit.find(line) != std::string::npos);
  }
}

TEST_CASE("systemctl reload runs the unit's --check first, which fails on a refused config", "[deploy][systemd]") {
  // systemd runs the ExecReload= lines in order and stops at the first that fails, so the
  // check must come before the signal, and must fail for a file the daemon would refuse.
  std::vector<std::string> reload;
  const std::regex kReload(R"(^ExecReload=(.*)$)");
  std::istringstream in(Source("deploy/systemd/shardcached.service"));
  std::smatch m;
  for (std::string line; std::getline(in, line);) {
    if (std::regex_match(line, m, kReload)) reload.push_back(m[1]);
  }
  REQUIRE(reload.size() == 2);
  CHECK(reload[1] == "/bin/kill -HUP $MAINPID");
  REQUIRE(reload[0].find("--check") != std::string::npos);
  TempDir dir;
  REQUIRE(WriteFileAtomic(dir / "good.toml", "upstream = \"file:///srv\"\n").ok());
  REQUIRE(WriteFileAtomic(dir / "bad.toml", "upstream = \"file:///srv\"\n[cache]\nsize = \"lots\"\n").ok());
  auto with = [&](const std::string& config) {
    return ReplaceAll(ReplaceAll(reload[0], "/usr/bin/shardcached", BinPath("shardcached")),
                      "/etc/shardcache/shardcached.toml", config);
  };
  std::string out;
  CHECK(RunCommand(with(dir / "good.toml"), &out) == 0);
  CHECK(RunCommand(with(dir / "bad.toml"), &out) == 2);
  INFO(out);
  CHECK(out.find("cache.size: 'lots'") != std::string::npos);
}

TEST_CASE("the unit's paths match the daemon's default config", "[deploy][systemd]") {
  // The socket lives in RuntimeDirectory=shardcache and the cache in CacheDirectory=shardcache:
  // the example config must point there, or ProtectSystem=strict makes them read-only.
  const std::string toml = Source("config/shardcached.toml");
  CHECK(toml.find("socket = \"/run/shardcache/shardcached.sock\"") != std::string::npos);
  CHECK(toml.find("dir = \"/var/cache/shardcache\"") != std::string::npos);
}

}  // namespace
}  // namespace shardcache::testing
