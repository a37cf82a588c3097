// Daemon: one shardcached process — the composition of the pipeline stages a config asks for,
// in the order bytes travel:
//
//   upstream source ──▶ [CachedSource: DRAM + NVMe]  ──▶ Origin gRPC server  (listen.origin)
//   (file:// | grpc://)   only when cache.size > 0 or      └▶ LocalService     (listen.socket)
//                         cache.memory_size > 0
//   + AdminServer (listen.metrics): /metrics /status /ready /evict
//
// The admin endpoint starts first so that /ready (503) and /metrics are observable while a
// long cache recovery runs; everything else starts in data-flow order, and a failure stops
// what was started, in reverse. Each stage is built from the config by one small function in
// daemon.cc; a stage whose component is not part of this build refuses its config key with a
// clear error rather than pretending.
//
// Reload: ApplyReload() takes a newly read, already validated Config and applies the keys that
// can change at run time (config::ReloadableDiff), through setters on the components. Other
// changed keys are reported to the caller, which warns; the running config keeps their old
// values so the next reload compares against what actually runs.
//
// Thread safety: Start(), Stop() and ApplyReload() from one controlling thread (main).
// StatusJson(), Readiness(), EvictDataset() and ready() from any thread (the admin server's
// workers).
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "common/mutex.h"
#include "common/status.h"
#include "config/config.h"
#include "daemon/source/chunk_source.h"

namespace shardcache::admin {
class AdminServer;
struct Readiness;
}

namespace shardcache::daemon {

class Daemon {
 public:
  explicit Daemon(config::Config config);
  ~Daemon();  // Stop()
  Daemon(const Daemon&) = delete;
  Daemon& operator=(const Daemon&) = delete;

  // Builds and starts every configured stage. `progress` receives short human-readable lines
  // ("recovering cache index", "serving") for systemd's STATUS=. On failure everything
  // started is stopped again and the status names the stage and key at fault.
  Status Start(const std::function<void(const std::string&)>& progress = {});
  // Graceful: stops accepting, lets in-flight requests end, then tears down in reverse order.
  void Stop();

  // What ApplyReload did.
  struct ReloadOutcome {
    std::vector<std::string> applied;      // reloadable keys now in effect
    std::vector<std::string> not_applied;  // changed keys that need a restart
    std::vector<std::string> failed;       // "key: why" for reloadable keys a setter refused
  };
  ReloadOutcome ApplyReload(const config::Config& loaded);

  // The /status document (see admin_server.h), as JSON: health "starting", "ok" or "degraded"
  // (a failing check, or the datasets could not be listed) and the problems.
  std::string StatusJson() const;
  // What /ready reports: serving, and the failing checks — "upstream" (a grpc upstream that has
  // not answered yet or is unreachable, upstream_health.h) and "cache_disk" (the NVMe tier's
  // disk is failing, disk_health.h).
  admin::Readiness Readiness() const;
  // Drops every cached chunk of `dataset` (all versions). FailedPrecondition when there is no
  // cache tier.
  Status EvictDataset(const std::string& dataset);
  bool ready() const { return ready_.load(std::memory_order_acquire); }

  // The config in effect (reloaded keys included). Controlling thread only.
  const config::Config& config() const { return config_; }
  // Port the admin server bound (useful with port 0 in tests); 0 when off.
  int admin_port() const;

 private:
  Status StartAdmin();
  Status BuildUpstream();
  // Wraps the upstream in a PeerGroupSource when [peers] names members (peer_group.h).
  Status BuildPeerGroup();
  Status BuildCache(const std::function<void(const std::string&)>& progress);
  Status StartOrigin();
  // The node side of checkpoint write-behind, when there is a staging dir (checkpoints.dir or
  // cache.dir); uploads go to a grpc upstream.
  Status BuildCheckpoints();
  Status StartLocal();
  Result<std::vector<v1::DatasetSummary>> ListDatasetsBounded() const;

  config::Config config_;
  mutable Mutex reload_mu_;  // guards the reloadable fields of config_ read by StatusJson
  const std::chrono::steady_clock::time_point started_at_ = std::chrono::steady_clock::now();
  std::atomic<bool> ready_{false};
  mutable Mutex list_mu_;
  mutable std::future<Result<std::vector<v1::DatasetSummary>>> list_future_ GUARDED_BY(list_mu_);

  // The pipeline stages, with the components' concrete types (defined in daemon.cc so this
  // header does not pull in gRPC, RocksDB and the serving code).
  struct Parts;
  std::unique_ptr<Parts> parts_;
  std::unique_ptr<admin::AdminServer> admin_;
};

}  // namespace shardcache::daemon
