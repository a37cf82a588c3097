// shardcached: the shardcache daemon. One binary for every role (origin, city-local middle
// tier, GPU node); the config file decides which (see config/shardcached.toml).
//
//   shardcached --config /etc/shardcache/shardcached.toml [--check]
//   shardcached --version
//
// Exit codes: 0 clean stop (or --check passed), 1 failure at start or run time, 2 bad command
// line or bad config — reported before anything is bound, every problem at once.
//
// Signals: SIGTERM / SIGINT stop gracefully and within kStopBound whatever the upstream does
// (trainers' clients reconnect to the successor); SIGHUP re-reads the config file (see Reload
// below). They are blocked in every thread and taken synchronously by the main loop with
// sigtimedwait, which also paces the systemd watchdog pings.
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

#include <CLI/CLI.hpp>
#include <google/protobuf/stubs/logging.h>
#include <spdlog/spdlog.h>

#include "common/allocator.h"
#include "common/log.h"
#include "common/thread_name.h"
#include "common/units.h"
#include "common/version.h"
#include "config/config.h"
#include "daemon/admin/systemd_notifier.h"
#include "daemon/daemon.h"

namespace {

using shardcache::config::Config;

// A stop takes this long at most: Daemon::Stop cancels what waits on the upstream, and should
// anything else hang, the process exits anyway — a crash-equivalent end the cache recovers from
// (index entries are published only after their data is durable). Below systemd's
// TimeoutStopSec and Kubernetes' grace period, and well below the 60 s a successor waits for
// the index LOCK.
constexpr auto kStopBound = std::chrono::seconds(25);

// Ends the process if the stop has not finished by kStopBound.
void ArmStopBound() {
  std::thread([] {
    shardcache::NameThisThread("sc-stop-bound");
    std::this_thread::sleep_for(kStopBound);
    spdlog::critical("stopping took longer than {} s; exiting now (the cache recovers as after a crash)",
                     kStopBound.count());
    spdlog::default_logger()->flush();
    std::_Exit(1);
  }).detach();
}

// libprotobuf writes its own complaints (a request whose string field is not UTF-8, ...) to
// stderr, once per message: a hostile client could flood the journal. They go through spdlog,
// rate-limited; the caller that got the parse failure reports it in its own words.
void ProtobufLogToSpdlog(google::protobuf::LogLevel level, const char* file, int line, const std::string& message) {
  const auto lvl = level >= google::protobuf::LOGLEVEL_ERROR ? spdlog::level::warn : spdlog::level::debug;
  SC_LOG_RATE_LIMITED(lvl, "protobuf ({}:{}): {}", file, line, message);
}

std::string Join(const std::vector<std::string>& v) {
  std::string out;
  for (const auto& s : v) out += (out.empty() ? "" : ", ") + s;
  return out;
}

// SIGHUP: an invalid new file is refused and the running config stays; changed keys that need
// a restart get a warning naming them; the reloadable ones are applied.
void Reload(const std::string& path, shardcache::daemon::Daemon& daemon,
            shardcache::admin::SystemdNotifier& notifier) {
  spdlog::info("SIGHUP: re-reading {}", path);
  auto loaded = shardcache::config::LoadConfig(path);
  if (!loaded.ok()) {
    spdlog::error("reload refused, the running configuration stays: {}", loaded.status().message());
    return;
  }
  const auto outcome = daemon.ApplyReload(*loaded);
  if (!outcome.not_applied.empty()) {
    spdlog::warn("reload: changed keys that need a restart were NOT applied: {}", Join(outcome.not_applied));
  }
  for (const auto& f : outcome.failed) spdlog::error("reload: {}", f);
  if (!outcome.applied.empty()) spdlog::info("reload: applied {}", Join(outcome.applied));
  if (outcome.applied.empty() && outcome.not_applied.empty() && outcome.failed.empty()) {
    spdlog::info("reload: configuration unchanged");
  }
  notifier.Status("serving (reloaded)");
}

// --check: the config is valid; what a container's memory limit must exceed (deploy/k8s sizes
// its limits from the "buffer memory" line).
void PrintCheckReport(const std::string& config_path, const Config& c) {
  std::printf("%s: OK (upstream %s)\n", config_path.c_str(), c.upstream.c_str());
  const uint64_t buffers = shardcache::config::BufferMemoryBytes(c);
  const std::string arenas = c.listen.socket.empty()
                                 ? "no trainer arenas (listen.socket is off)"
                                 : "local.max_connections " + std::to_string(c.local.max_connections) +
                                       " x local.arena_size " + shardcache::FormatBytes(c.local.arena_size_bytes);
  std::printf("buffer memory: up to %s (%llu bytes) = cache.memory_size %s + %s; working memory comes on top\n",
              shardcache::FormatBytes(buffers).c_str(), static_cast<unsigned long long>(buffers),
              shardcache::FormatBytes(c.cache.memory_bytes).c_str(), arenas.c_str());
}

// The main loop: takes the blocked `signals` synchronously (SIGHUP reloads; SIGTERM/SIGINT
// return) and pings the systemd watchdog between them.
void ServeUntilStopSignal(const sigset_t& signals, const std::string& config_path, shardcache::daemon::Daemon& daemon,
                          shardcache::admin::SystemdNotifier& notifier) {
  // Wake at least every half watchdog interval (or once a second) to ping systemd.
  const auto tick = notifier.watchdog_enabled()
                        ? std::min<std::chrono::microseconds>(notifier.watchdog_interval(), std::chrono::seconds(1))
                        : std::chrono::microseconds(std::chrono::seconds(1));
  auto next_ping = std::chrono::steady_clock::now();
  for (;;) {
    if (notifier.watchdog_enabled() && std::chrono::steady_clock::now() >= next_ping) {
      notifier.WatchdogPing();
      next_ping = std::chrono::steady_clock::now() + notifier.watchdog_interval();
    }
    timespec ts{static_cast<time_t>(tick.count() / 1000000), static_cast<long>(tick.count() % 1000000) * 1000};
    siginfo_t info;
    const int sig = sigtimedwait(&signals, &info, &ts);
    if (sig == SIGHUP) {
      Reload(config_path, daemon, notifier);
    } else if (sig == SIGTERM || sig == SIGINT) {
      spdlog::info("{}: stopping", sig == SIGTERM ? "SIGTERM" : "SIGINT");
      break;
    }
    // -1: timeout (EAGAIN) or EINTR; loop to ping and wait again.
  }
}

}  // namespace

int main(int argc, char** argv) {
  google::protobuf::SetLogHandler(ProtobufLogToSpdlog);
  CLI::App app{"shardcached — node-local caching daemon for remote training datasets"};
  std::string config_path;
  bool check_only = false;
  app.set_version_flag("--version", std::string("shardcached ") + shardcache::Version());
  app.add_option("-c,--config", config_path, "TOML config file (e.g. /etc/shardcache/shardcached.toml)")
      ->required();
  app.add_flag("--check", check_only,
               "validate the config, print every problem (exit 2) or the memory its buffers may take (exit 0)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }

  // Validate before anything is bound or started: a bad config is exit code 2.
  auto loaded = shardcache::config::LoadConfig(config_path);
  if (!loaded.ok()) {
    std::fprintf(stderr, "shardcached: bad config %s\n", loaded.status().message().c_str());
    return 2;
  }
  if (check_only) {
    PrintCheckReport(config_path, *loaded);
    return 0;
  }
  if (auto s = shardcache::SetupLogging(loaded->log.level); !s.ok()) {
    std::fprintf(stderr, "shardcached: log.level: %s\n", s.message().c_str());
    return 2;
  }

  // Block the signals we handle before any thread exists, so every thread inherits the mask
  // and only the main loop's sigtimedwait receives them.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  // A closed downstream socket must be an error return, not a process kill.
  signal(SIGPIPE, SIG_IGN);

  shardcache::admin::SystemdNotifier notifier;
  shardcache::daemon::Daemon daemon(*loaded);
  spdlog::info("shardcached starting: config {}, {}", config_path, shardcache::AllocatorName());
  notifier.BeginStartupKeepAlive();
  const shardcache::Status started = daemon.Start([&](const std::string& s) { notifier.Status(s); });
  notifier.EndStartupKeepAlive();
  if (!started.ok()) {
    std::fprintf(stderr, "shardcached: %s\n", started.ToString().c_str());
    return 1;
  }
  notifier.Ready("serving");

  ServeUntilStopSignal(signals, config_path, daemon, notifier);
  notifier.Stopping();
  ArmStopBound();
  daemon.Stop();
  spdlog::info("shardcached stopped");
  return 0;
}
