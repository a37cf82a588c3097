// shardctl top [--config PATH | --metrics-addr HOST:PORT] [--interval S] [--once]
// A live view of a running daemon, refreshed every interval from its /metrics: hit ratio,
// bytes per tier, upstream goodput, trainers' throughput and stall per loader. On a terminal
// each frame replaces the last (ANSI clear); piped, frames are separated by a blank line.
// --once prints a single frame (two scrapes one interval apart) and exits.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <thread>

#include "tools/shardctl/admin_client.h"
#include "tools/shardctl/command.h"
#include "tools/shardctl/top_view.h"

namespace shardcache::shardctl {
namespace {

volatile sig_atomic_t g_stop = 0;

Result<Samples> Scrape(AdminClient& client) {
  SC_ASSIGN_OR_RETURN(std::string body, client.Get("/metrics"));
  return ParsePrometheusText(body);
}

int RunTop(const AdminTarget& target, double interval_s, bool once) {
  if (!(interval_s >= 0.1 && interval_s <= 3600)) {
    std::fprintf(stderr, "shardctl top: --interval must be between 0.1 and 3600 seconds\n");
    return 2;
  }
  signal(SIGINT, [](int) { g_stop = 1; });
  const bool tty = isatty(STDOUT_FILENO) != 0;
  auto resolved = AdminClient::For(target);
  if (!resolved.ok()) {
    std::fprintf(stderr, "shardctl top: %s\n", resolved.status().message().c_str());
    return 1;
  }
  AdminClient& client = *resolved;
  const std::string& addr = client.address();
  auto prev = Scrape(client);
  if (!prev.ok()) {
    std::fprintf(stderr, "shardctl top: %s\n", prev.status().message().c_str());
    return 1;
  }
  auto prev_t = std::chrono::steady_clock::now();
  while (!g_stop) {
    std::this_thread::sleep_for(std::chrono::duration<double>(interval_s));
    if (g_stop) break;
    auto cur = Scrape(client);
    const auto now = std::chrono::steady_clock::now();
    if (!cur.ok()) {
      std::fprintf(stderr, "shardctl top: %s\n", cur.status().message().c_str());
      if (once) return 1;
      continue;
    }
    const std::string frame =
        RenderTopFrame(*prev, *cur, std::chrono::duration<double>(now - prev_t).count(), addr);
    if (tty && !once) std::fputs("\033[H\033[2J", stdout);  // home + clear screen
    std::fputs(frame.c_str(), stdout);
    if (!tty && !once) std::fputs("\n", stdout);
    std::fflush(stdout);
    if (once) return 0;
    prev = std::move(cur);
    prev_t = now;
  }
  return 0;
}

const CommandRegistration kTop("top", "live view of a running daemon (hit ratio, throughput, stalls)",
                               [](CLI::App* sub) -> std::function<int()> {
  auto target = std::make_shared<AdminTarget>();
  auto interval = std::make_shared<double>(1.0);
  auto once = std::make_shared<bool>(false);
  target->AddOptions(sub);
  sub->add_option("--interval", *interval, "seconds between frames")->capture_default_str();
  sub->add_flag("--once", *once, "print one frame and exit");
  return [target, interval, once] { return RunTop(*target, *interval, *once); };
});

}  // namespace
}  // namespace shardcache::shardctl
