#include "daemon/daemon.h"

#include <signal.h>

#include <future>

#include <grpcpp/grpcpp.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "common/log.h"
#include "common/metrics.h"
#include "common/units.h"
#include "common/version.h"
#include "daemon/admin/admin_server.h"
#include "daemon/cache/cached_source.h"
#include "daemon/checkpoint/checkpoint_stage.h"
#include "daemon/component_options.h"
#include "daemon/serve/grpc_server.h"
#include "daemon/serve/local_service.h"
#include "daemon/serve/origin_service.h"
#include "daemon/upstream/file_source.h"
#include "daemon/upstream/grpc_source.h"
#include "daemon/upstream/object_source.h"
#include "daemon/upstream/peer_group.h"

namespace shardcache::daemon {

struct Daemon::Parts {
  // Owned here until the cache tier takes it over; `grpc` stays valid either way (setters).
  std::unique_ptr<ChunkSource> upstream;
  upstream::GrpcSource* grpc = nullptr;
  upstream::PeerGroupSource* peers = nullptr;  // set when [peers] names a group; wraps upstream
  std::unique_ptr<cache::CachedSource> cache;
  // The source downstream services read from: the cache tier when there is one, else upstream.
  ChunkSource* serving = nullptr;
  std::unique_ptr<serve::OriginServer> origin;
  std::unique_ptr<checkpoint::CheckpointStage> checkpoints;  // outlives `local`, which hands it requests
  std::unique_ptr<serve::LocalService> local;
};

namespace {

metrics::Gauge* ReadyGauge() {
  static auto* g = metrics::Registry::Global().GetGauge(
      "shardcache_ready", "1 once recovery is done and every configured server is listening");
  return g;
}

}  // namespace

Daemon::Daemon(config::Config config) : config_(std::move(config)), parts_(std::make_unique<Parts>()) {}

Daemon::~Daemon() { Stop(); }

int Daemon::admin_port() const { return admin_ ? admin_->port() : 0; }

Status Daemon::StartAdmin() {
  if (config_.listen.metrics.empty()) return Status::Ok();
  admin::AdminOptions o = AdminOptionsFor(config_);
  admin::AdminHandlers h;
  h.status_json = [this] { return StatusJson(); };
  h.evict = [this](const std::string& d) { return EvictDataset(d); };
  h.ready = [this] { return Readiness(); };
  // The main loop stops the daemon on SIGTERM (main.cc): a drain is that stop, asked over HTTP.
  h.drain = [] { ::kill(::getpid(), SIGTERM); };
  admin_ = std::make_unique<admin::AdminServer>(o, std::move(h));
  return admin_->Start();
}

Status Daemon::BuildUpstream() {
  SC_ASSIGN_OR_RETURN(upstream::UpstreamUri u, upstream::ParseUpstreamUri(config_.upstream));
  if (u.scheme == upstream::UpstreamUri::Scheme::kFile) {
    auto source = upstream::FileSource::Open(u.path);
    if (!source.ok()) return source.status().WithContext("upstream " + config_.upstream);
    parts_->upstream = std::move(*source);
    return Status::Ok();
  }
  if (u.scheme == upstream::UpstreamUri::Scheme::kObject) {
    // [objstore]; what it leaves empty comes from the environment (objstore/options.h).
    auto source = upstream::ObjectSource::Open(u.object, config_.objstore);
    if (!source.ok()) return source.status().WithContext("upstream " + config_.upstream);
    parts_->upstream = std::move(*source);
    return Status::Ok();
  }
  auto source = upstream::GrpcSource::Create(GrpcSourceOptionsFor(config_, u));
  if (!source.ok()) return source.status().WithContext("upstream " + config_.upstream);
  parts_->grpc = source->get();
  parts_->upstream = std::move(*source);
  return Status::Ok();
}

Status Daemon::BuildPeerGroup() {
  if (!config_.peers.enabled()) return Status::Ok();
  auto group = upstream::PeerGroupSource::Create(PeerGroupOptionsFor(config_), std::move(parts_->upstream));
  if (!group.ok()) return group.status().WithContext("peers");
  parts_->peers = group->get();
  parts_->upstream = std::move(*group);
  return Status::Ok();
}

Status Daemon::BuildCache(const std::function<void(const std::string&)>& progress) {
  // No cache tier only for the origin role: a file:// upstream without an NVMe budget (the
  // page cache already holds hot files). A grpc upstream always gets one, for single-flight
  // and the DRAM tier even when cache.size = 0.
  const bool file_upstream = parts_->grpc == nullptr && parts_->peers == nullptr;
  if (file_upstream && config_.cache.size_bytes == 0) {
    parts_->serving = parts_->upstream.get();
    return Status::Ok();
  }
  const cache::CacheOptions& o = config_.cache;
  if (progress && o.size_bytes > 0) progress("recovering cache index in " + o.dir);
  auto cached = cache::CachedSource::Open(o, std::move(parts_->upstream));
  if (!cached.ok()) return cached.status().WithContext("cache (cache.dir " + o.dir + ")");
  parts_->cache = std::move(*cached);
  parts_->serving = parts_->cache.get();
  return Status::Ok();
}

Status Daemon::StartOrigin() {
  if (config_.listen.origin.empty()) return Status::Ok();
  const serve::ServerOptions o = OriginServerOptionsFor(config_);
  auto server = serve::StartOriginServer(*parts_->serving, o, OriginServiceOptionsFor(config_));
  if (!server.ok()) return server.status().WithContext("listen.origin " + o.listen);
  parts_->origin = std::move(*server);
  spdlog::info("Origin service on {}{}{}", o.listen, parts_->origin->server->tls() ? " (TLS)" : "",
               o.token.empty() ? "" : " with bearer token");
  if (!config_.checkpoints.root.empty()) {
    spdlog::info("checkpoint uploads committed under {} ({} writers)", config_.checkpoints.root,
                 config_.checkpoints.writers.size());
  }
  return Status::Ok();
}

Status Daemon::BuildCheckpoints() {
  checkpoint::CheckpointStageOptions o;
  o.dir = !config_.checkpoints.dir.empty() ? config_.checkpoints.dir
          : config_.cache.dir.empty()      ? std::string()
                                           : config_.cache.dir + "/checkpoints";
  if (o.dir.empty()) return Status::Ok();
  o.keep_local = config_.checkpoints.keep_local;
  std::unique_ptr<checkpoint::CheckpointTransfer> transfer;
  std::string why_not = "upstream " + config_.upstream + " takes no checkpoint uploads (only a grpc:// or grpcs:// upstream does)";
  if (parts_->grpc != nullptr) {
    checkpoint::CheckpointTransferOptions t;
    t.bandwidth_bytes_per_s = config_.checkpoints.upload_bandwidth_bytes_per_s;
    t.call_timeout = config_.fetch.timeout;
    upstream::GrpcSource* grpc = parts_->grpc;
    checkpoint::UpstreamCalls calls;
    calls.stub = [grpc](int i) { return v1::Origin::NewStub(grpc->NewCallChannel(i)); };
    calls.add_auth = [grpc](grpc::ClientContext* ctx) { grpc->AddAuth(ctx); };
    calls.where = grpc->Where();
    transfer = std::make_unique<checkpoint::CheckpointTransfer>(t, std::move(calls));
    why_not.clear();
  }
  auto stage = checkpoint::CheckpointStage::Open(o, std::move(transfer), why_not);
  if (!stage.ok()) return stage.status().WithContext("checkpoints (dir " + o.dir + ")");
  parts_->checkpoints = std::move(*stage);
  return Status::Ok();
}

Status Daemon::StartLocal() {
  if (config_.listen.socket.empty()) return Status::Ok();
  SC_RETURN_IF_ERROR(BuildCheckpoints());
  serve::LocalServiceOptions o = LocalServiceOptionsFor(config_);
  if (o.prefetch_lookahead_bytes < config_.fetch.prefetch_bytes) {
    spdlog::info("prefetch lookahead {} per loader (fetch.prefetch {} is more than an eighth of the cache)",
                 FormatBytes(o.prefetch_lookahead_bytes), FormatBytes(config_.fetch.prefetch_bytes));
  }
  if (parts_->cache && config_.cache.eviction == cache::EvictionPolicyKind::kClairvoyant) {
    // The plans know every loader's future reads: hand them to the clairvoyant policy.
    cache::CachedSource* cache = parts_->cache.get();
    o.observer = [cache](const DatasetPtr& dataset, const std::vector<serve::ChunkAccess>& order) {
      std::vector<cache::ChunkRef> refs;
      refs.reserve(order.size());
      for (const auto& a : order) refs.push_back({a.shard, a.chunk});
      cache->SetFutureAccessOrder(dataset->version, cache->access_plan().Now(dataset->version), refs);
    };
  }
  o.checkpoints = parts_->checkpoints.get();
  parts_->local = std::make_unique<serve::LocalService>(*parts_->serving, std::move(o));
  return parts_->local->Start().WithContext("listen.socket");
}

Status Daemon::Start(const std::function<void(const std::string&)>& progress) {
  auto say = [&](const std::string& s) {
    spdlog::info("{}", s);
    if (progress) progress(s);
  };
  ReadyGauge()->Set(0);
  auto fail = [&](Status s) {
    spdlog::error("start failed: {}", s.ToString());
    Stop();
    return s;
  };
  if (Status s = StartAdmin(); !s.ok()) return fail(s);
  say("connecting upstream " + config_.upstream);
  if (Status s = BuildUpstream(); !s.ok()) return fail(s);
  if (Status s = BuildPeerGroup(); !s.ok()) return fail(s);
  if (Status s = BuildCache(progress); !s.ok()) return fail(s);
  if (Status s = StartOrigin(); !s.ok()) return fail(s);
  if (Status s = StartLocal(); !s.ok()) return fail(s);
  ready_.store(true, std::memory_order_release);
  ReadyGauge()->Set(1);
  say("serving: upstream " + config_.upstream +
      (config_.listen.origin.empty() ? "" : ", origin " + config_.listen.origin) +
      (config_.listen.socket.empty() ? "" : ", socket " + config_.listen.socket) +
      (config_.listen.metrics.empty() ? "" : ", admin " + config_.listen.metrics));
  return Status::Ok();
}

void Daemon::Stop() {
  ready_.store(false, std::memory_order_release);
  ReadyGauge()->Set(0);
  // The admin server goes first: its Stop() waits for in-flight handlers, and handlers only
  // touch the stages while ready_ is set, so no handler sees a stage being torn down.
  if (admin_) {
    admin_->Stop();
    admin_.reset();
  }
  // Trainers see the daemon go now (and their clients reconnect to its successor). Then nothing
  // may wait on the upstream: a black-holed upstream would hold every batch assembly, warm job
  // and Origin stream until its deadline (minutes), and with them the daemon, its index LOCK
  // and its successor.
  if (parts_->local) parts_->local->Disconnect();
  if (parts_->serving != nullptr) parts_->serving->Shutdown();
  {
    MutexLock lock(&list_mu_);
    if (list_future_.valid()) list_future_.wait();
    list_future_ = {};
  }
  // Then the reverse of Start: downstream servers before the sources they read from.
  if (parts_->local) {
    parts_->local->Stop();
    parts_->local.reset();
  }
  parts_->checkpoints.reset();  // stops its upload (resumed from the journal at the next start)
  if (parts_->origin) {
    parts_->origin->server->Shutdown();
    parts_->origin.reset();
  }
  parts_->serving = nullptr;
  parts_->cache.reset();
  parts_->grpc = nullptr;
  parts_->upstream.reset();
}

Daemon::ReloadOutcome Daemon::ApplyReload(const config::Config& loaded) {
  ReloadOutcome out;
  const config::ConfigDiff diff = config::ReloadableDiff(config_, loaded);
  out.not_applied = diff.not_reloadable;
  for (const std::string& key : diff.reloadable) {
    Status st;
    if (key == "log.level") {
      st = SetLogLevel(loaded.log.level);
      if (st.ok()) {
        MutexLock lock(&reload_mu_);
        config_.log.level = loaded.log.level;
      }
    } else if (key == "cache.size") {
      st = parts_->cache ? parts_->cache->SetSizeBytes(loaded.cache.size_bytes)
                         : FailedPrecondition("this daemon runs without a cache tier; restart to add one");
      if (st.ok()) {
        MutexLock lock(&reload_mu_);
        config_.cache.size_bytes = loaded.cache.size_bytes;
      }
    } else if (key == "fetch.bandwidth") {
      if (parts_->grpc != nullptr) {
        parts_->grpc->SetBandwidth(loaded.fetch.bandwidth_bytes_per_s);
        MutexLock lock(&reload_mu_);
        config_.fetch.bandwidth_bytes_per_s = loaded.fetch.bandwidth_bytes_per_s;
      } else {
        st = FailedPrecondition("the cap applies to grpc:// upstreams; this daemon reads a file:// upstream");
      }
    } else if (key == "fetch.prefetch") {
      if (parts_->local) {
        config::Config effective = config_;
        effective.fetch.prefetch_bytes = loaded.fetch.prefetch_bytes;
        parts_->local->SetPrefetchLookaheadBytes(LoaderLookahead(effective));
        MutexLock lock(&reload_mu_);
        config_.fetch.prefetch_bytes = loaded.fetch.prefetch_bytes;
      } else {
        st = FailedPrecondition("the local service is off (listen.socket = \"\"); nothing prefetches");
      }
    } else {
      st = Internal("no reload rule");
    }
    if (st.ok()) out.applied.push_back(key);
    else out.failed.push_back(key + ": " + st.message());
  }
  return out;
}

admin::Readiness Daemon::Readiness() const {
  admin::Readiness r;
  r.serving = ready();
  if (!r.serving) return r;
  if (parts_->grpc != nullptr) {
    const auto h = parts_->grpc->health();
    if (!h.up) {
      r.failing.emplace_back("upstream", h.last_error.empty()
                                             ? config_.upstream + " has not answered yet"
                                             : config_.upstream + " unreachable for " +
                                                   std::to_string(static_cast<int64_t>(h.down_seconds)) +
                                                   " s: " + h.last_error);
    }
  }
  if (parts_->cache) {
    if (std::string problem = parts_->cache->disk_problem(); !problem.empty()) {
      r.failing.emplace_back("cache_disk", config_.cache.dir + ": " + problem);
    }
  }
  return r;
}

namespace {

// The tiers' part of /status: one entry per tier in j["tiers"], and the hit counts in j["cache"].
void AddCacheStatus(const cache::CacheStats& cs, const cache::CacheOptions& config, nlohmann::json& j) {
  if (cs.dram_budget_bytes > 0) {
    j["tiers"].push_back({{"name", "dram"},
                          {"used_bytes", cs.dram_used_bytes},
                          {"budget_bytes", cs.dram_budget_bytes},
                          {"entries", cs.dram_entries},
                          {"hits", cs.hits_dram},
                          {"served_bytes", cs.served_dram_bytes}});
  }
  if (cs.nvme_enabled) {
    j["tiers"].push_back({{"name", "nvme"},
                          {"used_bytes", cs.nvme.segment_allocated_bytes + cs.nvme.index_bytes},
                          {"budget_bytes", cs.nvme.size_bytes},
                          {"configured_budget_bytes", cs.nvme.configured_size_bytes},
                          {"healthy", cs.nvme.disk_problem.empty()},
                          {"problem", cs.nvme.disk_problem},
                          {"entries", cs.nvme.entries},
                          {"segments", cs.nvme.segments},
                          {"hits", cs.hits_nvme},
                          {"served_bytes", cs.served_nvme_bytes},
                          {"evicted_segments", cs.nvme.evicted_segments},
                          {"dir", config.dir},
                          {"eviction", cache::EvictionPolicyName(config.eviction)}});
  }
  const uint64_t hits = cs.hits_dram + cs.hits_nvme;
  j["cache"] = {{"hits", hits},
                {"misses", cs.misses},
                {"hit_ratio", hits + cs.misses == 0 ? 0.0 : double(hits) / double(hits + cs.misses)},
                {"served_upstream_bytes", cs.served_upstream_bytes}};
}

}  // namespace

std::string Daemon::StatusJson() const {
  nlohmann::json j;
  const admin::Readiness readiness = Readiness();
  const bool is_ready = readiness.serving;
  j["health"] = !is_ready ? "starting" : readiness.failing.empty() ? "ok" : "degraded";
  j["ready"] = is_ready && readiness.failing.empty();
  j["problems"] = nlohmann::json::array();
  for (const auto& [check, problem] : readiness.failing) j["problems"].push_back(check + ": " + problem);
  j["version"] = Version();
  j["pid"] = static_cast<int64_t>(getpid());
  j["uptime_seconds"] =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started_at_).count();
  {
    MutexLock lock(&reload_mu_);
    j["upstream"] = {{"uri", config_.upstream},
                     {"bandwidth_bytes_per_second", config_.fetch.bandwidth_bytes_per_s}};
    j["listen"] = {{"origin", config_.listen.origin},
                   {"socket", config_.listen.socket},
                   {"metrics", config_.listen.metrics}};
    j["log_level"] = config_.log.level;
    j["prefetch_lookahead_bytes"] = config_.fetch.prefetch_bytes;
  }
  j["tiers"] = nlohmann::json::array();
  j["datasets"] = nlohmann::json::array();
  if (is_ready && parts_->serving != nullptr) {
    auto list = ListDatasetsBounded();
    if (list.ok()) {
      for (const auto& d : *list) {
        j["datasets"].push_back({{"name", d.name()},
                                 {"version", d.version()},
                                 {"bytes", d.total_bytes()},
                                 {"samples", d.total_samples()},
                                 {"shards", d.shard_count()}});
      }
    } else {
      j["health"] = "degraded";
      j["datasets_error"] = list.status().ToString();
    }
  }
  if (is_ready && parts_->cache) AddCacheStatus(parts_->cache->Stats(), config_.cache, j);
  if (is_ready && parts_->grpc != nullptr) {
    const auto gs = parts_->grpc->stats();
    j["upstream"]["wire_bytes"] = gs.wire_bytes;
    j["upstream"]["payload_bytes"] = gs.payload_bytes;
    j["upstream"]["retries"] = gs.retries;
    j["upstream"]["checksum_failures"] = gs.checksum_failures;
    j["upstream"]["streams"] = gs.stream_limit;
    j["upstream"]["goodput_bytes_per_second"] = gs.goodput_bytes_per_s;
    const auto h = parts_->grpc->health();
    j["upstream"]["up"] = h.up;
    j["upstream"]["down_seconds"] = h.down_seconds;
    j["upstream"]["last_error"] = h.last_error;
  }
  if (is_ready && parts_->peers != nullptr) {
    j["peers"] = nlohmann::json::array();
    for (const auto& m : parts_->peers->Members()) {
      j["peers"].push_back({{"member", m.address}, {"self", m.self}, {"usable", m.usable}, {"share", m.share},
                            {"chunks", m.chunks}, {"bytes", m.bytes}, {"errors", m.errors}});
    }
  }
  if (is_ready && parts_->local) {
    j["clients"] = parts_->local->Stats();
  }
  return j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
}

Result<std::vector<v1::DatasetSummary>> Daemon::ListDatasetsBounded() const {
  // A grpc upstream that is down answers only after fetch.timeout and its retries; /status
  // must answer at once, so the listing runs on its own thread and a slow one is reported
  // (and reused by the next request) instead of waited for. Stop() waits for it.
  MutexLock lock(&list_mu_);
  if (!list_future_.valid()) {
    ChunkSource* source = parts_->serving;
    list_future_ = std::async(std::launch::async, [source] { return source->ListDatasets(); });
  }
  if (list_future_.wait_for(std::chrono::seconds(2)) != std::future_status::ready) {
    return Unavailable("the upstream did not list its datasets within 2 s");
  }
  return list_future_.get();  // leaves the future invalid: the next request lists afresh
}

Status Daemon::EvictDataset(const std::string& dataset) {
  SC_RETURN_IF_ERROR(CheckDatasetName(dataset));
  if (!ready() || !parts_->cache) {
    return FailedPrecondition("this daemon has no cache tier: nothing to evict");
  }
  return parts_->cache->Evict(dataset);
}

}  // namespace shardcache::daemon
