#include "common/log.h"

#include <sys/stat.h>

#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <memory>

#include <spdlog/pattern_formatter.h>
#include <spdlog/sinks/stdout_sinks.h>

namespace shardcache {
namespace {

// "%*": the message with its syslog priority prefix, which journald reads from a stream
// (sd-daemon(3)): "<3>" for an error, so that `journalctl -p warning` shows warnings and worse.
// journald makes each line an entry of its own, so the lines of a multi-line message (a
// refused config lists one problem a line) carry the prefix too.
class JournalLineFlag final : public spdlog::custom_flag_formatter {
 public:
  void format(const spdlog::details::log_msg& msg, const std::tm&, spdlog::memory_buf_t& dest) override {
    const char* priority = "<6>";
    switch (msg.level) {
      case spdlog::level::trace:
      case spdlog::level::debug: priority = "<7>"; break;
      case spdlog::level::warn: priority = "<4>"; break;
      case spdlog::level::err: priority = "<3>"; break;
      case spdlog::level::critical: priority = "<2>"; break;
      default: break;
    }
    const auto name = spdlog::level::to_string_view(msg.level);
    auto begin_line = [&] {
      dest.append(priority, priority + 3);
      dest.push_back('[');
      dest.append(name.data(), name.data() + name.size());
      dest.push_back(']');
      dest.push_back(' ');
    };
    begin_line();
    for (char c : msg.payload) {
      dest.push_back(c);
      if (c == '\n') begin_line();
    }
  }
  std::unique_ptr<custom_flag_formatter> clone() const override { return std::make_unique<JournalLineFlag>(); }
};

}  // namespace

bool StderrIsJournal() {
  // systemd sets JOURNAL_STREAM to "DEVICE:INODE" of the stream it connected; stderr may have
  // been redirected since (systemd.exec(5) asks to compare before trusting it).
  const char* env = std::getenv("JOURNAL_STREAM");
  uintmax_t dev = 0, ino = 0;
  if (env == nullptr || std::sscanf(env, "%" SCNuMAX ":%" SCNuMAX, &dev, &ino) != 2) return false;
  struct stat st;
  return fstat(2, &st) == 0 && static_cast<uintmax_t>(st.st_dev) == dev && static_cast<uintmax_t>(st.st_ino) == ino;
}

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
  if (StderrIsJournal()) {
    // journald stamps each line itself (no second timestamp) and takes its priority from the
    // "<N>" prefix.
    auto formatter = std::make_unique<spdlog::pattern_formatter>();
    formatter->add_flag<JournalLineFlag>('*').set_pattern("%*");
    spdlog::set_formatter(std::move(formatter));
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
