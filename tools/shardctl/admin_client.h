// AdminClient: shardctl's side of the daemon's admin HTTP endpoint (daemon/admin/admin_server.h)
// — GET /status, GET /metrics, POST /evict — plus a parser for the Prometheus text format that
// `shardctl top` reads, and how a subcommand finds the endpoint (AdminTarget).
//
// Thread safety: one AdminClient per thread; ParsePrometheusText is a pure function.
#pragma once

#include <map>
#include <memory>
#include <string>

#include <CLI/CLI.hpp>

#include "common/status.h"
#include "daemon/admin/admin_server.h"

namespace shardcache::shardctl {

constexpr char kDefaultConfigPath[] = "/etc/shardcache/shardcached.toml";

// Where a running daemon's admin endpoint is: --metrics-addr when given; else listen.metrics of
// the daemon's config (--config, default /etc/shardcache/shardcached.toml); else, when that
// file cannot be read or parsed, the default address — and the reason is kept for the error
// message should the default address not answer.
struct AdminTarget {
  std::string config = kDefaultConfigPath;
  std::string metrics_addr;     // "" = from the config
  bool config_given = false;    // --config was on the command line

  // Adds --config and --metrics-addr to a subcommand.
  void AddOptions(CLI::App* sub);
  // The address; *origin says where it came from ("listen.metrics in PATH", or "the default
  // address; PATH: why not"). FailedPrecondition when the config turns the endpoint off.
  Result<std::string> Resolve(std::string* origin) const;
};

class AdminClient {
 public:
  // `origin`: where the address came from, for messages (AdminTarget::Resolve).
  explicit AdminClient(std::string address, std::string origin = "")
      : address_(std::move(address)), origin_(std::move(origin)) {}
  // The client for `target`, or the error that keeps it from having an address.
  static Result<AdminClient> For(const AdminTarget& target);
  const std::string& address() const { return address_; }
  // Body of a 2xx answer; Unavailable naming the address when the daemon cannot be reached;
  // the HTTP code and body otherwise.
  Result<std::string> Get(const std::string& path, int timeout_ms = 5000);
  Result<std::string> Post(const std::string& path, int timeout_ms = 600000);

 private:
  Result<std::string> Request(bool post, const std::string& path, int timeout_ms);
  std::string address_;
  std::string origin_;
};

// One scrape: series key (metric name plus rendered labels exactly as exposed, e.g.
// `shardcache_cache_hits_total{tier="dram"}`) → value. Comments and histogram buckets
// are kept like any other series.
using Samples = std::map<std::string, double>;
// InvalidArgument naming the line on malformed input.
Result<Samples> ParsePrometheusText(const std::string& text);

// Value of a series; `fallback` when absent.
double Value(const Samples& s, const std::string& key, double fallback = 0);
// Sum over every series of metric `name` (all label sets).
double Sum(const Samples& s, const std::string& name);
// Series of metric `name`, keyed by their label text (`tier="dram"`, "" when unlabeled).
std::map<std::string, double> Series(const Samples& s, const std::string& name);
// Value of label `label` inside a label text such as `loader="3",dataset="x"`.
std::string LabelValue(const std::string& labels, const std::string& label);

}  // namespace shardcache::shardctl
