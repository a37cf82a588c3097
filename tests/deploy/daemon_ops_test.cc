// The real shardcached binary as an operator meets it: config errors (exit 2 before anything
// is bound), the admin endpoint (/metrics, /status, /ready, /evict), shardctl status / top /
// evict against it (found through its config), SIGHUP reload, and what systemd sees of it: the
// sd_notify protocol and log priorities under journald.
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>

#include <catch2/catch.hpp>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include "common/fs.h"
#include "integration/daemon_probe.h"
#include "testing/datasets.h"
#include "testing/process.h"
#include "testing/temp_dir.h"

namespace shardcache::testing {
namespace {

using namespace std::chrono_literals;

std::string Log(const std::string& path) {
  auto t = ReadFileToString(path);
  return t.ok() ? *t : "";
}

// The names of process `pid`'s threads as top -H and ps -L show them.
std::set<std::string> ThreadNames(pid_t pid) {
  std::set<std::string> names;
  const std::string tasks = "/proc/" + std::to_string(pid) + "/task";
  for (const auto& t : std::filesystem::directory_iterator(tasks)) {
    std::ifstream comm(t.path() / "comm");  // a /proc file: its size reads 0
    std::string name;
    if (std::getline(comm, name)) names.insert(name);
  }
  return names;
}

bool WaitFor(const std::function<bool()>& pred, std::chrono::milliseconds timeout = 20s) {
  const auto end = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < end) {
    if (pred()) return true;
    std::this_thread::sleep_for(50ms);
  }
  return pred();
}

// A dataset root with one small records dataset "tokens" (2 shards × 64 KiB, 16 KiB chunks).
struct Fixture {
  TempDir dir;
  std::string root = dir / "datasets";
  Fixture() {
    REQUIRE(MakeDirs(root).ok());
    auto d = MakeRecordsDataset(root, "tokens", 2, 64, 1024, 16 << 10);
    REQUIRE(d.ok());
  }
  std::string WriteConfig(const std::string& name, const std::string& text) {
    const std::string path = dir / name;
    REQUIRE(WriteFileAtomic(path, text).ok());
    return path;
  }
};

std::string OriginConfig(const Fixture& f, int metrics_port, const std::string& extra = "") {
  return "upstream = \"file://" + f.root + "\"\n[listen]\nmetrics = \"127.0.0.1:" + std::to_string(metrics_port) +
         "\"\nsocket = \"\"\n" + extra;
}

TEST_CASE("a bad config exits with code 2, lists every problem, and binds nothing", "[deploy][daemon]") {
  Fixture f;
  const int port = FreePort();
  const std::string sock = f.dir / "run/shardcached.sock";
  const std::string cache_dir = f.dir / "cache";
  const std::string cfg = f.WriteConfig("bad.toml",
      "upstream = \"file://" + f.root + "\"\n[listen]\nmetrics = \"127.0.0.1:" + std::to_string(port) +
      "\"\nsocket = \"" + sock + "\"\n[cache]\ndir = \"" + cache_dir +
      "\"\nsize = \"12 parsecs\"\neviction = \"fifo\"\n[fetch]\nbandwith = \"1Gbit\"\n");
  std::string out;
  const int rc = RunCommand(BinPath("shardcached") + " --config " + cfg, &out);
  INFO(out);
  CHECK(rc == 2);
  CHECK(out.find("3 problems") != std::string::npos);
  CHECK(out.find("cache.size: '12 parsecs'") != std::string::npos);
  CHECK(out.find("cache.eviction: 'fifo'") != std::string::npos);
  CHECK(out.find("fetch.bandwith: unknown key (did you mean 'fetch.bandwidth'?)") != std::string::npos);
  // Nothing was created or bound: no socket, no cache directory, the port is free.
  CHECK_FALSE(std::filesystem::exists(sock));
  CHECK_FALSE(std::filesystem::exists(cache_dir));
  CHECK_FALSE(WaitForPort(port, 200ms));
}

TEST_CASE("--check accepts the documented example config and refuses a missing file", "[deploy][daemon]") {
  std::string out;
  CHECK(RunCommand(BinPath("shardcached") + " --check --config " + SC_SOURCE_DIR + "/config/shardcached.toml", &out) == 0);
  CHECK(out.find("OK") != std::string::npos);
  out.clear();
  CHECK(RunCommand(BinPath("shardcached") + " --config /nonexistent/shardcached.toml", &out) == 2);
  CHECK(out.find("/nonexistent/shardcached.toml") != std::string::npos);
  CHECK(RunCommand(BinPath("shardcached") + " --bogus-flag", &out) == 2);
}

TEST_CASE("an origin daemon serves /metrics, /status and /ready, and shardctl status reads it", "[deploy][daemon]") {
  Fixture f;
  const int port = FreePort();
  const std::string cfg = f.WriteConfig("origin.toml", OriginConfig(f, port));
  Process daemon({BinPath("shardcached"), "--config", cfg}, f.dir / "daemon.log");
  REQUIRE(WaitFor([&] { return Http(port, "/ready").first == 200; }));
  INFO(Log(f.dir / "daemon.log"));

  auto [mcode, metrics] = Http(port, "/metrics");
  CHECK(mcode == 200);
  CHECK(metrics.find("# TYPE shardcache_process_resident_bytes gauge") != std::string::npos);
  CHECK(metrics.find("\nshardcache_ready 1\n") != std::string::npos);

  auto [scode, status] = Http(port, "/status");
  REQUIRE(scode == 200);
  const auto j = nlohmann::json::parse(status);
  CHECK(j["health"] == "ok");
  CHECK(j["upstream"]["uri"] == "file://" + f.root);
  REQUIRE(j["datasets"].size() == 1);
  CHECK(j["datasets"][0]["name"] == "tokens");
  CHECK(j["datasets"][0]["bytes"] == 2 * 64 * 1024);

  std::string out;
  CHECK(RunCommand(BinPath("shardctl") + " status --metrics-addr 127.0.0.1:" + std::to_string(port), &out) == 0);
  INFO(out);
  CHECK(out.find("health    ok") != std::string::npos);
  CHECK(out.find("tokens") != std::string::npos);
  CHECK(out.find("none (pass-through") != std::string::npos);

  // An origin has no cache tier: evict is refused with a reason, and unknown paths are 404.
  auto [ecode, ebody] = Http(port, "/evict?dataset=tokens", true);
  CHECK(ecode == 409);
  CHECK(ebody.find("no cache tier") != std::string::npos);
  CHECK(Http(port, "/evict?dataset=../etc", true).first == 400);
  CHECK(Http(port, "/nope").first == 404);
  // Bytes that are not UTF-8 in a path or a parameter: a 404 or 400 that says so, never an
  // exception out of the JSON writer that ends the daemon.
  auto [bad_code, bad_body] = Http(port, "/%ff");
  CHECK(bad_code == 404);
  CHECK(bad_body.find("no such endpoint") != std::string::npos);
  CHECK(Http(port, "/evict?dataset=%ff%fe", true).first / 100 == 4);
  CHECK(Http(port, "/ready").first == 200);

  daemon.Signal(SIGTERM);
  CHECK(daemon.Wait(20s) == 0);
  // shardctl explains an unreachable daemon instead of hanging.
  out.clear();
  CHECK(RunCommand(BinPath("shardctl") + " status --metrics-addr 127.0.0.1:" + std::to_string(port), &out) == 1);
  CHECK(out.find("cannot reach shardcached at 127.0.0.1:") != std::string::npos);
}

TEST_CASE("a node daemon with a cache tier: status shows tiers, top shows hits, evict empties the dataset",
          "[deploy][daemon][integration]") {
  Fixture f;
  const int origin_metrics = FreePort(), origin_port = FreePort(), node_metrics = FreePort(), node_port = FreePort();
  const std::string origin_cfg = f.WriteConfig(
      "origin.toml", OriginConfig(f, origin_metrics, "origin = \"127.0.0.1:" + std::to_string(origin_port) + "\"\n"));
  Process origin({BinPath("shardcached"), "--config", origin_cfg}, f.dir / "origin.log");
  const std::string node_cfg = f.WriteConfig("node.toml",
      "upstream = \"grpc://127.0.0.1:" + std::to_string(origin_port) + "\"\n[listen]\nmetrics = \"127.0.0.1:" +
      std::to_string(node_metrics) + "\"\norigin = \"127.0.0.1:" + std::to_string(node_port) +
      "\"\nsocket = \"" + (f.dir / "node.sock") + "\"\n[cache]\ndir = \"" + (f.dir / "cache") + "\"\nsize = \"64MiB\"\nsegment_size = \"8MiB\"\n"
      "memory_size = \"0\"\n");
  Process node({BinPath("shardcached"), "--config", node_cfg}, f.dir / "node.log");
  REQUIRE(WaitFor([&] { return Http(origin_metrics, "/ready").first == 200; }));
  REQUIRE(WaitFor([&] { return Http(node_metrics, "/ready").first == 200; }));
  INFO("origin log:\n" << Log(f.dir / "origin.log") << "\nnode log:\n" << Log(f.dir / "node.log"));

  // Read shard 0 through the node twice: cold (upstream), then warm (NVMe; no DRAM tier here).
  const std::string addr = "127.0.0.1:" + std::to_string(node_metrics);
  const std::string fetch = BinPath("shardctl") + " fetch --upstream grpc://127.0.0.1:" + std::to_string(node_port) +
                            " tokens 0 " + (f.dir / "shard0.out");
  std::string out;
  REQUIRE(RunCommand(fetch, &out) == 0);
  REQUIRE(RunCommand(fetch, &out) == 0);
  INFO(out);

  // Each of the daemon's own threads carries the name of its job (top -H, ps -L, perf).
  {
    const std::set<std::string> names = ThreadNames(node.pid());
    std::string all;
    for (const auto& n : names) all += n + " ";
    INFO("threads: " << all);
    for (const char* job : {"sc-up-fetch", "sc-up-hedge", "sc-up-probe", "sc-nvme-write", "sc-admin-http", "sc-accept",
                            "sc-reaper"}) {
      CHECK(names.count(job) == 1);
    }
  }

  // jemalloc serves the daemon's heap (common/allocator.h; not in sanitizer builds): the log names
  // it, and the heap gauges are its accounting.
#ifdef SC_TEST_JEMALLOC
  {
    const std::string log = Log(f.dir / "node.log");
    CHECK(log.find("shardcached starting: config " + node_cfg + ", jemalloc 5") != std::string::npos);
    CHECK(log.find(", 8 arenas") != std::string::npos);  // common/allocator.cc's options were read
    auto [code, metrics] = Http(node_metrics, "/metrics");
    REQUIRE(code == 200);
    const size_t at = metrics.find("\nshardcache_process_heap_in_use_bytes ");
    REQUIRE(at != std::string::npos);
    CHECK(std::stod(metrics.substr(at + 38)) > 1 << 20);  // 0 where the stats are not jemalloc's
  }
#endif

  // The tier gauges are computed when scraped: a /metrics that no /status preceded already
  // counts the cached bytes (they read 0 until someone asked for /status).
  {
    auto [code, metrics] = Http(node_metrics, "/metrics");
    REQUIRE(code == 200);
    const size_t at = metrics.find("\nshardcache_cache_nvme_used_bytes ");
    REQUIRE(at != std::string::npos);
    CHECK(std::stod(metrics.substr(at + 34)) > 0);
  }

  out.clear();
  CHECK(RunCommand(BinPath("shardctl") + " status --metrics-addr " + addr, &out) == 0);
  INFO(out);
  CHECK(out.find("nvme") != std::string::npos);
  CHECK(out.find("64.00 MiB") != std::string::npos);  // the NVMe budget
  CHECK(out.find("hit ratio 50.0% (4 hits, 4 misses)") != std::string::npos);

  out.clear();
  CHECK(RunCommand(BinPath("shardctl") + " top --once --interval 0.2 --metrics-addr " + addr, &out) == 0);
  CHECK(out.find("hit ratio  50.0%") != std::string::npos);  // nothing read during the frame: since start
  CHECK(out.find("upstream") != std::string::npos);
  CHECK(out.find("\033[2J") == std::string::npos);  // no ANSI clear when not a terminal

  // SIGHUP shrinks the NVMe budget and changes the bandwidth cap and the prefetch lookahead of
  // the running node.
  {
    auto text = ReadFileToString(node_cfg);
    REQUIRE(text.ok());
    std::string changed = *text;
    changed.replace(changed.find("size = \"64MiB\""), 14, "size = \"32MiB\"");
    REQUIRE(WriteFileAtomic(node_cfg, changed + "[fetch]\nbandwidth = \"100MB/s\"\nprefetch = \"8MiB\"\n").ok());
    node.Signal(SIGHUP);
    REQUIRE(WaitFor([&] {
      return Log(f.dir / "node.log").find("reload: applied cache.size, fetch.bandwidth, fetch.prefetch") != std::string::npos;
    }));
    auto st = nlohmann::json::parse(Http(node_metrics, "/status").second);
    REQUIRE(st["tiers"].size() == 1);
    CHECK(st["tiers"][0]["budget_bytes"] == 32 << 20);
    CHECK(st["upstream"]["bandwidth_bytes_per_second"] == 100000000);
    CHECK(st["prefetch_lookahead_bytes"] == 8 << 20);
  }

  out.clear();
  CHECK(RunCommand(BinPath("shardctl") + " evict tokens --metrics-addr " + addr, &out) == 0);
  CHECK(out.find("evicted dataset 'tokens'") != std::string::npos);
  // After the eviction the same read misses again.
  REQUIRE(RunCommand(fetch, &out) == 0);
  auto j = nlohmann::json::parse(Http(node_metrics, "/status").second);
  CHECK(j["cache"]["misses"] == 8);
  CHECK(j["cache"]["hits"] == 4);

  // With the origin gone, /status still answers promptly (the listing is bounded at 2 s).
  origin.Kill();
  const auto t0 = std::chrono::steady_clock::now();
  auto [code, body] = Http(node_metrics, "/status");
  const double took_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  INFO(body);
  CHECK(code == 200);
  CHECK(took_s < 5.0);
  node.Signal(SIGTERM);
  CHECK(node.Wait(60s) == 0);
}

TEST_CASE("SIGHUP applies reloadable keys, warns about the rest, and refuses a broken file", "[deploy][daemon]") {
  Fixture f;
  const int port = FreePort();
  const std::string base = OriginConfig(f, port);
  const std::string cfg = f.WriteConfig("reload.toml", base);
  Process daemon({BinPath("shardcached"), "--config", cfg}, f.dir / "daemon.log");
  REQUIRE(WaitFor([&] { return Http(port, "/ready").first == 200; }));

  // A reloadable key (log.level) and one that needs a restart (cache.eviction).
  f.WriteConfig("reload.toml", base + "[log]\nlevel = \"debug\"\n[cache]\neviction = \"static\"\n");
  daemon.Signal(SIGHUP);
  REQUIRE(WaitFor([&] { return Log(f.dir / "daemon.log").find("reload: applied log.level") != std::string::npos; }));
  const std::string log = Log(f.dir / "daemon.log");
  INFO(log);
  CHECK(log.find("changed keys that need a restart were NOT applied: cache.eviction") != std::string::npos);
  CHECK(nlohmann::json::parse(Http(port, "/status").second)["log_level"] == "debug");

  // A broken file is refused; the running config stays and the daemon keeps serving.
  f.WriteConfig("reload.toml", base + "[log]\nlevel = \"shouty\"\n");
  daemon.Signal(SIGHUP);
  REQUIRE(WaitFor([&] { return Log(f.dir / "daemon.log").find("reload refused") != std::string::npos; }));
  CHECK(Log(f.dir / "daemon.log").find("log.level: 'shouty' is not a log level") != std::string::npos);
  CHECK(Http(port, "/ready").first == 200);
  CHECK(nlohmann::json::parse(Http(port, "/status").second)["log_level"] == "debug");

  // A reloadable key this daemon cannot apply (no cache tier on an origin) is an error line.
  f.WriteConfig("reload.toml", base + "[log]\nlevel = \"debug\"\n[cache]\nsize = \"1GiB\"\n");
  daemon.Signal(SIGHUP);
  REQUIRE(WaitFor([&] { return Log(f.dir / "daemon.log").find("reload: cache.size:") != std::string::npos; }));
  daemon.Signal(SIGTERM);
  CHECK(daemon.Wait(20s) == 0);
}

// A Unix datagram socket standing in for systemd's NOTIFY_SOCKET.
class NotifySocket {
 public:
  explicit NotifySocket(const std::string& path) : path_(path) {
    fd_ = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::snprintf(a.sun_path, sizeof a.sun_path, "%s", path.c_str());
    REQUIRE(bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    timeval tv{0, 100000};
    setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  }
  ~NotifySocket() { close(fd_); }
  // Collects datagrams until `pred(all so far)` or timeout.
  bool ReceiveUntil(const std::function<bool(const std::string&)>& pred, std::chrono::milliseconds timeout) {
    const auto end = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < end) {
      char buf[4096];
      const ssize_t n = recv(fd_, buf, sizeof buf, 0);
      if (n > 0) received_ += std::string(buf, n) + "\n--\n";
      if (pred(received_)) return true;
    }
    return false;
  }
  const std::string& received() const { return received_; }

 private:
  std::string path_;
  int fd_ = -1;
  std::string received_;
};

size_t Count(const std::string& s, const std::string& what) {
  size_t n = 0;
  for (size_t p = 0; (p = s.find(what, p)) != std::string::npos; p += what.size()) ++n;
  return n;
}

TEST_CASE("under systemd the daemon sends READY=1, watchdog pings at half WatchdogSec, and STOPPING=1",
          "[deploy][daemon][systemd]") {
  Fixture f;
  const int port = FreePort();
  const std::string cfg = f.WriteConfig("notify.toml", OriginConfig(f, port));
  NotifySocket notify(f.dir / "notify.sock");
  // WATCHDOG_USEC = 0.4 s: pings every 0.2 s. `env` execs the daemon, so the pid is the same.
  Process daemon({"env", "NOTIFY_SOCKET=" + (f.dir / "notify.sock"), "WATCHDOG_USEC=400000",
                  BinPath("shardcached"), "--config", cfg},
                 f.dir / "daemon.log");
  INFO(Log(f.dir / "daemon.log"));
  REQUIRE(notify.ReceiveUntil([](const std::string& r) { return r.find("READY=1") != std::string::npos; }, 20s));
  // The startup keep-alive extended the start timeout before READY.
  CHECK(notify.received().find("EXTEND_TIMEOUT_USEC=") < notify.received().find("READY=1"));
  CHECK(Http(port, "/ready").first == 200);
  const size_t before = Count(notify.received(), "WATCHDOG=1");
  REQUIRE(notify.ReceiveUntil([&](const std::string& r) { return Count(r, "WATCHDOG=1") >= before + 4; }, 3s));
  daemon.Signal(SIGTERM);
  REQUIRE(notify.ReceiveUntil([](const std::string& r) { return r.find("STOPPING=1") != std::string::npos; }, 10s));
  CHECK(daemon.Wait(20s) == 0);
}

TEST_CASE("shardctl status, top and evict find the daemon through its config, and say where they looked when not",
          "[deploy][daemon][shardctl]") {
  Fixture f;
  const int port = FreePort();
  const std::string cfg = f.WriteConfig("origin.toml", OriginConfig(f, port));
  Process daemon({BinPath("shardcached"), "--config", cfg}, f.dir / "daemon.log");
  REQUIRE(WaitFor([&] { return Http(port, "/ready").first == 200; }));

  std::string out;
  CHECK(RunCommand(BinPath("shardctl") + " status --config " + cfg, &out) == 0);
  INFO(out);
  CHECK(out.find("health    ok") != std::string::npos);
  out.clear();
  CHECK(RunCommand(BinPath("shardctl") + " top --once --interval 0.2 --config " + cfg, &out) == 0);
  CHECK(out.find("shardcache top  127.0.0.1:" + std::to_string(port)) != std::string::npos);
  out.clear();
  // An origin has no cache: the evict reached the daemon and was refused there.
  CHECK(RunCommand(BinPath("shardctl") + " evict tokens --config " + cfg, &out) == 1);
  CHECK(out.find("no cache tier") != std::string::npos);
  // --metrics-addr still wins over the config.
  const std::string elsewhere = f.WriteConfig("elsewhere.toml", OriginConfig(f, FreePort()));
  out.clear();
  CHECK(RunCommand(BinPath("shardctl") + " status --config " + elsewhere + " --metrics-addr 127.0.0.1:" +
                       std::to_string(port), &out) == 0);

  // A config whose admin endpoint is off, and one that cannot be read: the reason is named.
  const std::string off = f.WriteConfig("off.toml", "upstream = \"file://" + f.root + "\"\n[listen]\nmetrics = \"\"\n");
  out.clear();
  CHECK(RunCommand(BinPath("shardctl") + " status --config " + off, &out) == 1);
  CHECK(out.find("admin endpoint is off (listen.metrics = \"\" in " + off + ")") != std::string::npos);
  out.clear();
  const int rc = RunCommand(BinPath("shardctl") + " status --config /nonexistent/shardcached.toml", &out);
  CHECK(out.find("/nonexistent/shardcached.toml") != std::string::npos);
  if (rc != 0) CHECK(out.find("cannot reach shardcached at 127.0.0.1:9750 (the default address; ") != std::string::npos);
  daemon.Signal(SIGTERM);
  CHECK(daemon.Wait(20s) == 0);
}

TEST_CASE("under journald every line starts with its syslog priority, continuation lines too",
          "[deploy][daemon][systemd]") {
  Fixture f;
  const int port = FreePort();
  const std::string base = OriginConfig(f, port);
  const std::string cfg = f.WriteConfig("journal.toml", base);
  // systemd connects stderr to the journal and names that stream in JOURNAL_STREAM.
  const std::string log = f.dir / "journal.log";
  REQUIRE(WriteFileAtomic(log, "").ok());
  struct stat st;
  REQUIRE(::stat(log.c_str(), &st) == 0);
  const std::string stream = std::to_string(st.st_dev) + ":" + std::to_string(st.st_ino);
  Process daemon({"env", "JOURNAL_STREAM=" + stream, BinPath("shardcached"), "--config", cfg}, log);
  REQUIRE(WaitFor([&] { return Http(port, "/ready").first == 200; }));
  // A warning (a key that needs a restart) and an error over two lines (a refused file).
  f.WriteConfig("journal.toml", base + "[cache]\neviction = \"static\"\n");
  daemon.Signal(SIGHUP);
  REQUIRE(WaitFor([&] { return Log(log).find("NOT applied") != std::string::npos; }));
  f.WriteConfig("journal.toml", base + "[log]\nlevel = \"shouty\"\n");
  daemon.Signal(SIGHUP);
  REQUIRE(WaitFor([&] { return Log(log).find("reload refused") != std::string::npos; }));
  const std::string text = Log(log);
  INFO(text);
  CHECK(text.find("<6>[info] shardcached starting") != std::string::npos);
  CHECK(text.find("<4>[warning] reload: changed keys that need a restart were NOT applied") != std::string::npos);
  CHECK(text.find("<3>[error] reload refused") != std::string::npos);
  CHECK(text.find("\n<3>[error]   log.level: 'shouty' is not a log level") != std::string::npos);
  // Every line carries a priority, and no second timestamp.
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    INFO(line);
    CHECK(line.rfind("<", 0) == 0);
  }
  daemon.Signal(SIGTERM);
  CHECK(daemon.Wait(20s) == 0);

  // A JOURNAL_STREAM that is not this stderr (redirected since): plain lines with timestamps.
  const std::string plain = f.dir / "plain.log";
  f.WriteConfig("journal.toml", base);
  Process redirected({"env", "JOURNAL_STREAM=" + stream, BinPath("shardcached"), "--config", cfg}, plain);
  REQUIRE(WaitFor([&] { return Http(port, "/ready").first == 200; }));
  CHECK(Log(plain).rfind("[20", 0) == 0);
}

}  // namespace
}  // namespace shardcache::testing
