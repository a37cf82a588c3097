// shardctl status [--config PATH | --metrics-addr HOST:PORT] [--json]
// The daemon's health, upstream, peer group members, cache tiers (used vs budget), clients and
// datasets, from its admin endpoint's /status document.
#include <cstdio>

#include <nlohmann/json.hpp>

#include "common/units.h"
#include "tools/shardctl/admin_client.h"
#include "tools/shardctl/command.h"

namespace shardcache::shardctl {
namespace {

uint64_t U64(const nlohmann::json& j, const char* key) {
  return j.contains(key) && j[key].is_number() ? j[key].get<uint64_t>() : 0;
}

std::string Duration(double seconds) {
  const uint64_t s = static_cast<uint64_t>(seconds);
  char buf[64];
  if (s >= 86400) std::snprintf(buf, sizeof buf, "%llud%02lluh", (unsigned long long)(s / 86400), (unsigned long long)(s % 86400 / 3600));
  else if (s >= 3600) std::snprintf(buf, sizeof buf, "%lluh%02llum", (unsigned long long)(s / 3600), (unsigned long long)(s % 3600 / 60));
  else std::snprintf(buf, sizeof buf, "%llum%02llus", (unsigned long long)(s / 60), (unsigned long long)(s % 60));
  return buf;
}

// The peer group: one row per member — whether it is this node, set aside after a failure,
// its share of the hash space, and what it delivered to this node.
void PrintPeers(const nlohmann::json& peers) {
  std::printf("\n%-28s %5s %7s %10s %12s %8s\n", "PEER", "STATE", "SHARE", "CHUNKS", "BYTES", "ERRORS");
  for (const auto& m : peers) {
    const char* state = m.value("self", false) ? "self" : (m.value("usable", false) ? "up" : "aside");
    std::printf("%-28s %5s %6.1f%% %10llu %12s %8llu\n", m.value("member", "?").substr(0, 28).c_str(), state,
                100.0 * m.value("share", 0.0), (unsigned long long)U64(m, "chunks"),
                FormatBytes(U64(m, "bytes")).c_str(), (unsigned long long)U64(m, "errors"));
  }
  std::printf("\n");
}

int RunStatus(const AdminTarget& target, bool json) {
  auto client = AdminClient::For(target);
  if (!client.ok()) {
    std::fprintf(stderr, "shardctl status: %s\n", client.status().message().c_str());
    return 1;
  }
  const std::string& addr = client->address();
  auto body = client->Get("/status");
  if (!body.ok()) {
    std::fprintf(stderr, "shardctl status: %s\n", body.status().message().c_str());
    return 1;
  }
  if (json) {
    std::fputs(body->c_str(), stdout);
    return 0;
  }
  const auto j = nlohmann::json::parse(*body, nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    std::fprintf(stderr, "shardctl status: %s/status did not return a JSON object\n", addr.c_str());
    return 1;
  }
  const std::string health = j.value("health", "?");
  std::printf("health    %s (pid %lld, up %s, shardcached %s)\n", health.c_str(),
              static_cast<long long>(j.value("pid", 0)), Duration(j.value("uptime_seconds", 0.0)).c_str(),
              j.value("version", "?").c_str());
  // What makes it degraded: each failing check of /ready, one line each.
  if (j.contains("problems") && j["problems"].is_array()) {
    for (const auto& p : j["problems"]) std::printf("problem   %s\n", p.get<std::string>().c_str());
  }
  if (j.contains("upstream")) {
    const auto& u = j["upstream"];
    const uint64_t cap = U64(u, "bandwidth_bytes_per_second");
    std::printf("upstream  %s  cap %s", u.value("uri", "?").c_str(),
                cap == 0 ? "none" : (FormatBytes(cap) + "/s").c_str());
    if (u.contains("payload_bytes")) {
      const double wire = static_cast<double>(U64(u, "wire_bytes")), payload = static_cast<double>(U64(u, "payload_bytes"));
      std::printf("  fetched %s (wire %s, x%.2f)  streams %llu  retries %llu  checksum failures %llu",
                  FormatBytes(U64(u, "payload_bytes")).c_str(), FormatBytes(U64(u, "wire_bytes")).c_str(),
                  wire > 0 ? payload / wire : 1.0, (unsigned long long)U64(u, "streams"),
                  (unsigned long long)U64(u, "retries"), (unsigned long long)U64(u, "checksum_failures"));
    }
    std::printf("\n");
  }
  if (j.contains("peers") && j["peers"].is_array()) PrintPeers(j["peers"]);
  if (j.contains("listen")) {
    const auto& l = j["listen"];
    auto show = [](const std::string& v) { return v.empty() ? std::string("off") : v; };
    std::printf("listen    origin %s  socket %s  admin %s\n", show(l.value("origin", "")).c_str(),
                show(l.value("socket", "")).c_str(), show(l.value("metrics", "")).c_str());
  }
  if (j.contains("tiers") && !j["tiers"].empty()) {
    std::printf("\n%-6s %12s %12s %6s %12s %14s\n", "TIER", "USED", "BUDGET", "USE%", "ENTRIES", "SERVED");
    for (const auto& t : j["tiers"]) {
      const uint64_t used = U64(t, "used_bytes"), budget = U64(t, "budget_bytes");
      std::printf("%-6s %12s %12s %5.1f%% %12llu %14s\n", t.value("name", "?").c_str(),
                  FormatBytes(used).c_str(), FormatBytes(budget).c_str(),
                  budget ? 100.0 * static_cast<double>(used) / static_cast<double>(budget) : 0.0,
                  (unsigned long long)U64(t, "entries"), FormatBytes(U64(t, "served_bytes")).c_str());
    }
    if (j.contains("cache")) {
      const auto& c = j["cache"];
      std::printf("hit ratio %.1f%% (%llu hits, %llu misses)\n", 100.0 * c.value("hit_ratio", 0.0),
                  (unsigned long long)U64(c, "hits"), (unsigned long long)U64(c, "misses"));
    }
  } else {
    std::printf("\ntiers     none (pass-through: cache.size = 0)\n");
  }
  if (j.contains("clients") && j["clients"].is_object()) {
    const auto& c = j["clients"];
    std::printf("clients   %llu connections, %llu loaders, %llu slots in use, %s served, stalled %.1f s\n",
                (unsigned long long)U64(c, "connections"), (unsigned long long)U64(c, "loaders"),
                (unsigned long long)U64(c, "slots_in_use"), FormatBytes(U64(c, "bytes")).c_str(),
                static_cast<double>(U64(c, "stall_us")) / 1e6);
  }
  if (j.contains("datasets_error")) {
    std::printf("\ndatasets  unavailable: %s\n", j["datasets_error"].get<std::string>().c_str());
  } else if (j.contains("datasets")) {
    std::printf("\n%-32s %-18s %8s %12s %12s\n", "DATASET", "VERSION", "SHARDS", "SAMPLES", "BYTES");
    for (const auto& d : j["datasets"]) {
      std::printf("%-32s %-18s %8llu %12llu %12s\n", d.value("name", "?").c_str(),
                  d.value("version", "").substr(0, 16).c_str(), (unsigned long long)U64(d, "shards"),
                  (unsigned long long)U64(d, "samples"), FormatBytes(U64(d, "bytes")).c_str());
    }
    if (j["datasets"].empty()) std::printf("(no datasets)\n");
  }
  return health == "ok" ? 0 : 1;
}

const CommandRegistration kStatus("status", "show a running daemon's health, tiers and datasets",
                                  [](CLI::App* sub) -> std::function<int()> {
  auto target = std::make_shared<AdminTarget>();
  auto json = std::make_shared<bool>(false);
  target->AddOptions(sub);
  sub->add_flag("--json", *json, "print the raw /status JSON document");
  return [target, json] { return RunStatus(*target, *json); };
});

}  // namespace
}  // namespace shardcache::shardctl
