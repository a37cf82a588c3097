// shardctl drain [--config PATH | --metrics-addr HOST:PORT] [--timeout SECONDS]
// Stops a running daemon the way SIGTERM does (POST /drain): its trainers are disconnected and
// their clients reconnect to the successor, and the stop is bounded. Waits until the daemon is
// gone (its admin endpoint stops answering); exit 0 then, 1 when it is still up after --timeout.
#include <chrono>
#include <cstdio>
#include <thread>

#include "tools/shardctl/admin_client.h"
#include "tools/shardctl/command.h"

namespace shardcache::shardctl {
namespace {

int RunDrain(const AdminTarget& target, int timeout_s) {
  auto client = AdminClient::For(target);
  if (!client.ok()) {
    std::fprintf(stderr, "shardctl drain: %s\n", client.status().message().c_str());
    return 1;
  }
  const auto t0 = std::chrono::steady_clock::now();
  if (auto posted = client->Post("/drain", 10000); !posted.ok()) {
    std::fprintf(stderr, "shardctl drain: %s\n", posted.status().message().c_str());
    return 1;
  }
  std::printf("draining the daemon at %s\n", client->address().c_str());
  const auto deadline = t0 + std::chrono::seconds(timeout_s);
  while (std::chrono::steady_clock::now() < deadline) {
    auto r = client->Get("/ready", 1000);
    if (!r.ok() && r.status().code() == StatusCode::kUnavailable) {
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::printf("stopped in %.1f s (its admin endpoint is gone; the process exits within 25 s)\n", s);
      return 0;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  std::fprintf(stderr, "shardctl drain: the daemon at %s still answers after %d s\n", client->address().c_str(),
               timeout_s);
  return 1;
}

const CommandRegistration kDrain("drain", "stop a running daemon gracefully (trainers move to its successor)",
                                 [](CLI::App* sub) -> std::function<int()> {
  auto target = std::make_shared<AdminTarget>();
  auto timeout_s = std::make_shared<int>(60);
  target->AddOptions(sub);
  sub->add_option("--timeout", *timeout_s, "seconds to wait for the daemon to be gone")->check(CLI::PositiveNumber);
  return [target, timeout_s] { return RunDrain(*target, *timeout_s); };
});

}  // namespace
}  // namespace shardcache::shardctl
