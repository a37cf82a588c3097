#include "tools/shardctl/top_view.h"

#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <map>
#include <vector>

#include "common/units.h"

namespace shardcache::shardctl {
namespace {

std::string Fmt(const char* fmt, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  return buf;
}

std::string Rate(double bytes_per_s) {
  return FormatBytes(static_cast<uint64_t>(std::max(0.0, bytes_per_s))) + "/s";
}

// The series with labels `k` of a family (Series), 0 when it has none.
double At(const std::map<std::string, double>& series, const std::string& k) {
  auto it = series.find(k);
  return it == series.end() ? 0.0 : it->second;
}

std::string Uptime(double s) {
  const long long t = static_cast<long long>(s);
  if (t >= 3600) return Fmt("%lldh%02lldm", t / 3600, t % 3600 / 60);
  return Fmt("%lldm%02llds", t / 60, t % 60);
}


// Where the node's bytes came from in the interval: its own tiers, the members of its peer
// group, and its own upstream link (the long link, or the next tier); one row per member.
std::string RenderSources(const Samples& prev, const Samples& cur, double dt) {
  auto delta = [&](const std::string& key) { return std::max(0.0, Value(cur, key) - Value(prev, key)); };
  const auto peer_bytes = Series(cur, "shardcache_peer_bytes_total");
  if (peer_bytes.empty()) return "";
  const auto peer_bytes_prev = Series(prev, "shardcache_peer_bytes_total");
  const auto chunks = Series(cur, "shardcache_peer_chunks_total");
  const auto errors = Series(cur, "shardcache_peer_errors_total");
  const auto usable = Series(cur, "shardcache_peer_usable");
  const auto share = Series(cur, "shardcache_peer_share");
  const auto self = Series(cur, "shardcache_peer_self");
  double from_peers = 0;
  std::string rows;
  for (const auto& [labels, bytes] : peer_bytes) {
    const double moved = std::max(0.0, bytes - At(peer_bytes_prev, labels));
    const bool is_self = At(self, labels) > 0;
    if (!is_self) from_peers += moved;
    rows += Fmt("%-28s %5s %6.1f%% %12s %12s %10.0f %8.0f\n", LabelValue(labels, "member").substr(0, 28).c_str(),
                is_self ? "self" : (At(usable, labels) > 0 ? "up" : "aside"), 100 * At(share, labels),
                Rate(moved / dt).c_str(), FormatBytes(static_cast<uint64_t>(bytes)).c_str(), At(chunks, labels),
                At(errors, labels));
  }
  const std::string sb = "shardcache_cache_served_bytes_total";
  std::string out = Fmt("sources   local tiers %s  peers %s  own upstream %s\n",
                        Rate((delta(sb + "{tier=\"dram\"}") + delta(sb + "{tier=\"nvme\"}")) / dt).c_str(),
                        Rate(from_peers / dt).c_str(),
                        Rate(delta("shardcache_upstream_payload_bytes_total") / dt).c_str());
  out += Fmt("\n%-28s %5s %7s %12s %12s %10s %8s\n", "PEER", "STATE", "SHARE", "RATE", "BYTES", "CHUNKS", "ERRORS");
  return out + rows;
}

}  // namespace

std::string RenderTopFrame(const Samples& prev, const Samples& cur, double dt, const std::string& address) {
  if (dt <= 0) dt = 1;
  auto delta = [&](const std::string& key) { return std::max(0.0, Value(cur, key) - Value(prev, key)); };
  auto delta_sum = [&](const std::string& name) { return std::max(0.0, Sum(cur, name) - Sum(prev, name)); };
  std::string out;
  out += Fmt("shardcache top  %s  up %s  every %.1f s\n\n", address.c_str(),
             Uptime(Value(cur, "shardcache_process_uptime_seconds")).c_str(), dt);

  // Cache: hit ratio over the interval (since start when nothing was read in it).
  const std::string hd = "shardcache_cache_hits_total{tier=\"dram\"}", hn = "shardcache_cache_hits_total{tier=\"nvme\"}";
  const bool has_cache = cur.count(hd) != 0;
  if (has_cache) {
    double dram = delta(hd), nvme = delta(hn), miss = delta("shardcache_cache_misses_total");
    std::string when = "last interval";
    if (dram + nvme + miss == 0) {
      dram = Value(cur, hd);
      nvme = Value(cur, hn);
      miss = Value(cur, "shardcache_cache_misses_total");
      when = "since start";
    }
    const double total = dram + nvme + miss;
    if (total > 0) {
      out += Fmt("cache     hit ratio %5.1f%%  (dram %.1f%%, nvme %.1f%%, miss %.1f%%; %s)\n",
                 100 * (dram + nvme) / total, 100 * dram / total, 100 * nvme / total, 100 * miss / total, when.c_str());
    } else {
      out += "cache     no reads yet\n";
    }
    const std::string sb = "shardcache_cache_served_bytes_total";
    out += Fmt("served    %s  (dram %s, nvme %s, upstream %s)\n", Rate(delta_sum(sb) / dt).c_str(),
               Rate(delta(sb + "{tier=\"dram\"}") / dt).c_str(), Rate(delta(sb + "{tier=\"nvme\"}") / dt).c_str(),
               Rate(delta(sb + "{tier=\"upstream\"}") / dt).c_str());
    out += Fmt("tiers     dram %s / %s", FormatBytes(Value(cur, "shardcache_cache_dram_used_bytes")).c_str(),
               FormatBytes(Value(cur, "shardcache_cache_dram_budget_bytes")).c_str());
    if (Value(cur, "shardcache_cache_nvme_budget_bytes") > 0) {
      out += Fmt("   nvme %s / %s   evicting %s", FormatBytes(Value(cur, "shardcache_cache_nvme_used_bytes")).c_str(),
                 FormatBytes(Value(cur, "shardcache_cache_nvme_budget_bytes")).c_str(),
                 Rate(delta("shardcache_cache_evicted_bytes_total") / dt).c_str());
    }
    out += "\n";
  } else {
    out += "cache     none (pass-through)\n";
  }

  // Upstream: goodput (verified bytes), wire bytes and their ratio, streams, retries.
  if (cur.count("shardcache_upstream_payload_bytes_total") != 0) {
    const double payload = delta("shardcache_upstream_payload_bytes_total") / dt;
    const double wire = delta("shardcache_upstream_wire_bytes_total") / dt;
    out += Fmt("upstream  %s verified  wire %s (x%.2f)  streams %.0f/%.0f  retries %.0f/s  bad chunks %.0f\n",
               Rate(payload).c_str(), Rate(wire).c_str(), wire > 0 ? payload / wire : 1.0,
               Value(cur, "shardcache_upstream_fetches_in_flight"), Value(cur, "shardcache_upstream_stream_limit"),
               delta("shardcache_upstream_retries_total") / dt,
               Value(cur, "shardcache_upstream_checksum_failures_total"));
  } else if (cur.count("shardcache_file_read_bytes_total") != 0) {
    out += Fmt("upstream  files: reading %s\n", Rate(delta("shardcache_file_read_bytes_total") / dt).c_str());
  }
  if (cur.count("shardcache_origin_chunks_total") != 0) {
    out += Fmt("origin    serving %s to downstream daemons (wire %s)\n",
               Rate(delta("shardcache_origin_payload_bytes_total") / dt).c_str(),
               Rate(delta("shardcache_origin_wire_bytes_total") / dt).c_str());
  }

  out += RenderSources(prev, cur, dt);

  // Trainers, node-wide.
  if (cur.count("shardcache_serve_bytes_total") != 0) {
    const double conns = Value(cur, "shardcache_serve_connections");
    const double stall_s = delta("shardcache_serve_stall_seconds_total") / dt;
    out += Fmt("trainers  %.0f connected  %.1f batches/s  %s  waiting %.2f s/s",
               conns, delta("shardcache_serve_batches_total") / dt,
               Rate(delta("shardcache_serve_bytes_total") / dt).c_str(), stall_s);
    if (conns > 0) out += Fmt(" (stall %.1f%% per connection)", 100 * stall_s / conns);
    out += "\n";
  }

  // Per (dataset, rank): the pairs with open loaders or reads in the interval.
  const auto bytes = Series(cur, "shardcache_loader_bytes_total");
  const auto bytes_prev = Series(prev, "shardcache_loader_bytes_total");
  const auto batches = Series(cur, "shardcache_loader_batches_total");
  const auto batches_prev = Series(prev, "shardcache_loader_batches_total");
  const auto stall = Series(cur, "shardcache_loader_stall_seconds_total");
  const auto stall_prev = Series(prev, "shardcache_loader_stall_seconds_total");
  const auto open = Series(cur, "shardcache_loader_open");
  auto d = [&](const std::map<std::string, double>& a, const std::map<std::string, double>& b, const std::string& k) {
    return std::max(0.0, At(a, k) - At(b, k));
  };
  struct Row { std::string dataset, rank; double loaders, bps, batches, stall_pct; };
  std::vector<Row> rows;
  for (const auto& [labels, v] : bytes) {
    const double loaders = At(open, labels), moved = d(bytes, bytes_prev, labels);
    if (loaders <= 0 && moved <= 0) continue;
    // Stall per loader: the trainers of one rank (DataLoader workers) each wait on their own.
    rows.push_back({LabelValue(labels, "dataset"), LabelValue(labels, "rank"), loaders, moved / dt,
                    d(batches, batches_prev, labels) / dt,
                    100 * d(stall, stall_prev, labels) / dt / std::max(1.0, loaders)});
  }
  if (!rows.empty()) {
    // The most stalled first: they are the ones an operator looks for.
    std::sort(rows.begin(), rows.end(), [](const Row& a, const Row& b) { return a.stall_pct > b.stall_pct; });
    out += Fmt("\n%-28s %5s %7s %10s %14s %7s\n", "DATASET", "RANK", "LOADERS", "BATCHES/S", "THROUGHPUT", "STALL%");
    for (const auto& r : rows) {
      out += Fmt("%-28s %5s %7.0f %10.1f %14s %6.1f%%\n", r.dataset.substr(0, 28).c_str(), r.rank.c_str(), r.loaders,
                 r.batches, Rate(r.bps).c_str(), std::min(100.0, r.stall_pct));
    }
  } else {
    out += "\n(no loader open; trainer figures above are node-wide)\n";
  }
  return out;
}

}  // namespace shardcache::shardctl
