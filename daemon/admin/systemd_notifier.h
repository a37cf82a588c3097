// SystemdNotifier: the daemon's side of systemd's Type=notify protocol (sd_notify(3)).
//
//   READY=1              once recovery is done and every server is listening
//   EXTEND_TIMEOUT_USEC  while a long start (cache recovery) runs, so TimeoutStartSec does not
//                        kill a daemon that is making progress
//   WATCHDOG=1           every half WatchdogSec (WATCHDOG_USEC) while the main loop is alive
//   STATUS=...           a human-readable line shown by `systemctl status`
//   STOPPING=1           when a graceful stop begins
//
// Outside systemd (no NOTIFY_SOCKET) every call is a cheap no-op. Built without libsystemd,
// the same: a log line at construction says so.
//
// Thread safety: all methods may be called from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <string>
#include <thread>

#include "common/mutex.h"

namespace shardcache::admin {

class SystemdNotifier {
 public:
  SystemdNotifier();
  ~SystemdNotifier();  // ends a running startup keep-alive

  // True when systemd asked for watchdog pings (WATCHDOG_USEC set for this pid).
  bool watchdog_enabled() const { return watchdog_interval_.count() > 0; }
  // Half of WatchdogSec: how often to ping. Zero when the watchdog is off.
  std::chrono::microseconds watchdog_interval() const { return watchdog_interval_; }

  void Ready(const std::string& status);
  void Stopping();
  void Status(const std::string& status);
  void WatchdogPing();

  // While a long start runs: a thread that, every `period`, extends the start timeout by
  // 3 × period and pings the watchdog. EndStartupKeepAlive() (or destruction) stops it.
  void BeginStartupKeepAlive(std::chrono::milliseconds period = std::chrono::seconds(5));
  void EndStartupKeepAlive();

 private:
  void Notify(const std::string& message);

  std::chrono::microseconds watchdog_interval_{0};
  std::thread keeper_;
  Mutex mu_;
  CondVar cv_;
  bool keeper_stop_ GUARDED_BY(mu_) = false;
};

}  // namespace shardcache::admin
