#include "daemon/admin/systemd_notifier.h"
#include "common/thread_name.h"

#include <spdlog/spdlog.h>

#if SC_HAVE_SYSTEMD
#include <systemd/sd-daemon.h>
#endif

namespace shardcache::admin {

SystemdNotifier::SystemdNotifier() {
#if SC_HAVE_SYSTEMD
  uint64_t usec = 0;
  // unset_environment = 0: child processes are none of our business, keep it simple.
  if (sd_watchdog_enabled(0, &usec) > 0 && usec > 0) {
    watchdog_interval_ = std::chrono::microseconds(usec / 2);
    spdlog::info("systemd watchdog: pinging every {} ms", watchdog_interval_.count() / 1000);
  }
#else
  spdlog::info("built without libsystemd: no sd_notify readiness or watchdog pings");
#endif
}

SystemdNotifier::~SystemdNotifier() { EndStartupKeepAlive(); }

void SystemdNotifier::Notify(const std::string& message) {
#if SC_HAVE_SYSTEMD
  const int rc = sd_notify(0, message.c_str());
  if (rc < 0) spdlog::warn("sd_notify({}) failed: {}", message, strerror(-rc));
#else
  (void)message;
#endif
}

void SystemdNotifier::Ready(const std::string& status) { Notify("READY=1\nSTATUS=" + status); }
void SystemdNotifier::Stopping() { Notify("STOPPING=1\nSTATUS=stopping"); }
void SystemdNotifier::Status(const std::string& status) { Notify("STATUS=" + status); }
void SystemdNotifier::WatchdogPing() {
  if (watchdog_enabled()) Notify("WATCHDOG=1");
}

void SystemdNotifier::BeginStartupKeepAlive(std::chrono::milliseconds period) {
  EndStartupKeepAlive();
  {
    MutexLock lock(&mu_);
    keeper_stop_ = false;
  }
  const auto extend_us = std::chrono::duration_cast<std::chrono::microseconds>(period * 3).count();
  const std::string extend = "EXTEND_TIMEOUT_USEC=" + std::to_string(extend_us);
  // The first extension at once, not from the thread: a start that ends before the thread is
  // scheduled has still told systemd.
  Notify(extend);
  WatchdogPing();
  keeper_ = std::thread([this, period, extend] {
    NameThisThread("sc-sd-notify");
    MutexLock lock(&mu_);
    while (!cv_.WaitFor(&mu_, period, [this]() REQUIRES(mu_) { return keeper_stop_; })) {
      Notify(extend);
      WatchdogPing();
    }
  });
}

void SystemdNotifier::EndStartupKeepAlive() {
  {
    MutexLock lock(&mu_);
    keeper_stop_ = true;
  }
  cv_.NotifyAll();
  if (keeper_.joinable()) keeper_.join();
}

}  // namespace shardcache::admin
