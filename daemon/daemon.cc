#include "daemon/daemon.h"

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "common/log.h"
#include "common/metrics.h"
#include "common/units.h"
#include "daemon/admin/admin_server.h"
#include "daemon/serve/local_service.h"

namespace shardcache::daemon {

struct Daemon::Parts {
  std::unique_ptr<ChunkSource> upstream;
  // The source downstream services read from: the cache tier when there is one, else upstream.
  ChunkSource* serving = nullptr;
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
  admin::AdminOptions o;
  o.listen = config_.listen.metrics;
  admin::AdminHandlers h;
  h.status_json = [this] { return StatusJson(); };
  h.evict = [this](const std::string& d) { return EvictDataset(d); };
  h.ready = [this] { return ready(); };
  admin_ = std::make_unique<admin::AdminServer>(o, std::move(h));
  return admin_->Start();
}

Status Daemon::BuildUpstream() {
  SC_ASSIGN_OR_RETURN(config::Upstream u, config::ParseUpstream(config_.upstream));
  switch (u.scheme) {
    case config::Upstream::Scheme::kFile:
      return Unimplemented("upstream: file:// sources (daemon/upstream FileSource) are not part of this build");
    case config::Upstream::Scheme::kGrpc:
    case config::Upstream::Scheme::kGrpcs:
      return Unimplemented("upstream: grpc:// and grpcs:// sources (daemon/upstream GrpcSource) are not part of this build");
  }
  return Internal("upstream: unknown scheme");
}

Status Daemon::BuildCache(const std::function<void(const std::string&)>& progress) {
  parts_->serving = parts_->upstream.get();
  if (config_.cache.size_bytes > 0) {
    return Unimplemented("cache.size: the cache tiers (daemon/cache CachedSource) are not part of this build; set cache.size = 0");
  }
  return Status::Ok();
}

Status Daemon::StartOrigin() {
  if (config_.listen.origin.empty()) return Status::Ok();
  return Unimplemented("listen.origin: the Origin gRPC server (daemon/serve/grpc_server.h) is not part of this build; set listen.origin = \"\"");
}

Status Daemon::StartLocal() {
  if (config_.listen.socket.empty()) return Status::Ok();
  serve::LocalServiceOptions o;
  o.socket_path = config_.listen.socket;
  o.allowed_uids = config_.local.allowed_uids;
  o.allowed_gids = config_.local.allowed_gids;
  o.arena_bytes = config_.local.arena_size_bytes;
  o.slot_count = config_.local.slots;
  o.prefetch_lookahead_bytes = config_.fetch.prefetch_bytes;
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
  // Then the reverse of Start: downstream servers before the sources they read from.
  if (parts_->local) {
    parts_->local->Stop();
    parts_->local.reset();
  }
  parts_->serving = nullptr;
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
        std::lock_guard<std::mutex> lock(reload_mu_);
        config_.log.level = loaded.log.level;
      }
    } else if (key == "cache.size") {
      st = FailedPrecondition("no cache tier in this build; restart to change");
    } else if (key == "fetch.bandwidth") {
      st = FailedPrecondition("the upstream fetcher of this build has no run-time bandwidth setter; restart to change");
    } else if (key == "fetch.prefetch") {
      st = FailedPrecondition("the local service of this build has no run-time prefetch setter; restart to change");
    } else {
      st = Internal("no reload rule");
    }
    if (st.ok()) out.applied.push_back(key);
    else out.failed.push_back(key + ": " + st.message());
  }
  return out;
}

std::string Daemon::StatusJson() const {
  nlohmann::json j;
  const bool is_ready = ready();
  j["health"] = is_ready ? "ok" : "starting";
  j["ready"] = is_ready;
  j["version"] = "0.1.0";
  j["pid"] = static_cast<int64_t>(getpid());
  j["uptime_seconds"] =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started_at_).count();
  {
    std::lock_guard<std::mutex> lock(reload_mu_);
    j["upstream"] = {{"uri", config_.upstream},
                     {"bandwidth_bytes_per_second", config_.fetch.bandwidth_bytes_per_s}};
    j["listen"] = {{"origin", config_.listen.origin},
                   {"socket", config_.listen.socket},
                   {"metrics", config_.listen.metrics}};
    j["log_level"] = config_.log.level;
  }
  j["tiers"] = nlohmann::json::array();
  j["datasets"] = nlohmann::json::array();
  if (is_ready && parts_->serving != nullptr) {
    auto list = parts_->serving->ListDatasets();
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
  if (is_ready && parts_->local) {
    j["clients"] = nlohmann::json::parse(parts_->local->StatsJson(), nullptr, false);
  }
  return j.dump(2) + "\n";
}

Status Daemon::EvictDataset(const std::string& dataset) {
  SC_RETURN_IF_ERROR(CheckDatasetName(dataset));
  return FailedPrecondition("no cache tier in this build: nothing to evict");
}

}  // namespace shardcache::daemon
