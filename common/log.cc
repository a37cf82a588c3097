#include "common/log.h"

#include <cstdlib>

#include <spdlog/sinks/stdout_sinks.h>

namespace shardcache {

Status SetLogLevel(const std::string& level) {
  const auto lvl = spdlog::level::from_str(level);
  // from_str maps unknown names to "off"; only accept "off" when asked for.
  if (lvl == spdlog::level::off && level != "off") {
    return InvalidArgument("unknown log level '" + level +
                           "' (use trace, debug, info, warn, error, critical, off)");
  }
  spdlog::set_level(lvl);
  return Status::Ok();
}

Status SetupLogging(const std::string& level) {
  auto logger = spdlog::stderr_logger_mt("shardcache");
  spdlog::set_default_logger(logger);
  if (std::getenv("JOURNAL_STREAM") != nullptr) {
    // journald stamps each line itself: no second timestamp.
    spdlog::set_pattern("[%l] %v");
  } else {
    spdlog::set_pattern("[%Y-%m-%d %H:%M:%S.%e] [%^%l%$] [%t] %v");
  }
  return SetLogLevel(level);
}

bool RateLimiter::Allow(uint64_t* suppressed) {
  const int64_t now_s = std::chrono::duration_cast<std::chrono::seconds>(
                            std::chrono::steady_clock::now().time_since_epoch()).count();
  int64_t start = window_start_s_.load(std::memory_order_relaxed);
  if (now_s != start && window_start_s_.compare_exchange_strong(start, now_s)) {
    in_window_.store(0, std::memory_order_relaxed);
  }
  if (in_window_.fetch_add(1, std::memory_order_relaxed) < per_second_) {
    *suppressed = suppressed_.exchange(0, std::memory_order_relaxed);
    return true;
  }
  suppressed_.fetch_add(1, std::memory_order_relaxed);
  return false;
}

}  // namespace shardcache
