// Logging through spdlog. Every component logs with the plain spdlog::info/warn/error calls;
// this header only sets the process up and offers rate limiting for hot paths.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>

#include <spdlog/spdlog.h>

#include "common/status.h"

namespace shardcache {

// Configures the default logger: stderr, the given level ("trace".."critical", "off").
// When stderr is the journal (StderrIsJournal) each line starts with its syslog priority
// ("<3>" error, "<4>" warning, "<6>" info, "<7>" debug; sd-daemon(3)) and carries no timestamp,
// since journald adds its own.
// Returns InvalidArgument for an unknown level name.
Status SetupLogging(const std::string& level);
// True when stderr is the stream systemd connected to the journal: JOURNAL_STREAM names its
// device and inode.
bool StderrIsJournal();
Status SetLogLevel(const std::string& level);

// Allows at most `per_second` events per second; the rest are counted and reported with the
// next allowed event. Thread-safe (atomics only).
class RateLimiter {
 public:
  explicit RateLimiter(uint32_t per_second) : per_second_(per_second) {}
  // Returns true when this event may be logged; *suppressed receives how many were dropped
  // since the last allowed one.
  bool Allow(uint64_t* suppressed);

 private:
  const uint32_t per_second_;
  std::atomic<int64_t> window_start_s_{0};
  std::atomic<uint32_t> in_window_{0};
  std::atomic<uint64_t> suppressed_{0};
};

}  // namespace shardcache

// Logs at most 5 times per second per call site; reports how many were dropped.
#define SC_LOG_RATE_LIMITED(level, ...)                                              \
  do {                                                                               \
    static ::shardcache::RateLimiter sc_rl_(5);                                      \
    uint64_t sc_dropped_ = 0;                                                        \
    if (sc_rl_.Allow(&sc_dropped_)) {                                                \
      if (sc_dropped_) spdlog::log(level, "({} similar messages suppressed)", sc_dropped_); \
      spdlog::log(level, __VA_ARGS__);                                               \
    }                                                                                \
  } while (0)
