// shardctl checkpoints [--socket PATH] [--json] [NAME]
// Lists the checkpoints trainers saved through a node daemon (checkpoint write-behind) and where
// each stands: local (durable on the node, waiting), uploading (bytes, rate, ETA), remote
// (committed upstream, verified), failed (why). Exit status 1 when any has failed.
#include <cstdio>

#include <nlohmann/json.hpp>

#include "common/units.h"
#include "config/config.h"
#include "tools/shardctl/command.h"
#include "tools/shardctl/local_control.h"

namespace shardcache::shardctl {
namespace {

struct CheckpointsArgs {
  std::string socket = config::Config{}.listen.socket;
  std::string name;
  bool json = false;
};

void PrintTable(const v1::CheckpointStatusResponse& r) {
  std::printf("%-48s %-9s %10s %10s %12s %8s %-5s %s\n", "NAME", "STATE", "SIZE", "UPSTREAM", "RATE", "ETA",
              "LOCAL", "ERROR");
  for (const v1::CheckpointInfo& c : r.checkpoints()) {
    const std::string rate = c.upload_bytes_per_s() > 0
                                 ? FormatBytes(static_cast<uint64_t>(c.upload_bytes_per_s())) + "/s"
                                 : "-";
    const std::string eta = c.eta_s() > 0 ? std::to_string(static_cast<int64_t>(c.eta_s() + 0.5)) + " s" : "-";
    std::printf("%-48s %-9s %10s %10s %12s %8s %-5s %s\n", c.name().c_str(), c.state().c_str(),
                FormatBytes(c.size()).c_str(), FormatBytes(c.uploaded_bytes()).c_str(), rate.c_str(), eta.c_str(),
                c.local() ? "yes" : "no", c.error().c_str());
  }
}

int RunCheckpoints(const CheckpointsArgs& a) {
  auto fail = [](const Status& s) {
    std::fprintf(stderr, "shardctl checkpoints: %s\n", s.ToString().c_str());
    return 1;
  };
  auto conn = LocalControl::Connect(a.socket);
  if (!conn.ok()) return fail(conn.status());
  v1::LocalRequest req;
  req.mutable_checkpoint_status()->set_name(a.name);
  v1::LocalResponse resp;
  if (Status s = conn->Call(req, &resp, "CheckpointStatus"); !s.ok()) return fail(s);
  const v1::CheckpointStatusResponse& r = resp.checkpoint_status();
  bool any_failed = false;
  for (const auto& c : r.checkpoints()) any_failed = any_failed || c.state() == "failed";
  if (a.json) {
    nlohmann::json out = nlohmann::json::array();
    for (const v1::CheckpointInfo& c : r.checkpoints()) {
      out.push_back({{"name", c.name()}, {"state", c.state()}, {"size", c.size()},
                     {"uploaded_bytes", c.uploaded_bytes()}, {"upload_bytes_per_s", c.upload_bytes_per_s()},
                     {"eta_s", c.eta_s()}, {"local", c.local()}, {"error", c.error()},
                     {"saved_unix_ms", c.saved_unix_ms()}});
    }
    std::printf("%s\n", nlohmann::json{{"checkpoints", out}}.dump().c_str());
  } else {
    PrintTable(r);
  }
  return any_failed ? 1 : 0;
}

const CommandRegistration kCheckpoints(
    "checkpoints", "list checkpoints saved through a node daemon and their upload states",
    [](CLI::App* sub) -> std::function<int()> {
      auto a = std::make_shared<CheckpointsArgs>();
      sub->add_option("name", a->name, "one checkpoint (default: all)");
      sub->add_option("--socket", a->socket, "the daemon's listen.socket")->capture_default_str();
      sub->add_flag("--json", a->json, "one JSON object instead of the table");
      return [a] { return RunCheckpoints(*a); };
    });

}  // namespace
}  // namespace shardcache::shardctl
