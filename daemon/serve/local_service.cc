#include "daemon/serve/local_service.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "common/allocator.h"
#include "common/log.h"
#include "common/metrics.h"
#include "common/thread_name.h"
#include "daemon/serve/serve_metrics.h"
#include "shardcache/local.pb.h"

namespace shardcache::serve {
namespace {

metrics::Counter* RefusedCounter() { return ServeMetrics::Get().refused_connections; }
metrics::Gauge* ConnectionsGauge() { return ServeMetrics::Get().connections; }

}  // namespace

LocalService::LocalService(ChunkSource& source, LocalServiceOptions options)
    : source_(source),
      options_(std::move(options)),
      access_(PeerAccessOptions{options_.allowed_uids, options_.allowed_gids, options_.allowed_groups,
                                options_.allow_root_and_self}),
      reporter_(AccessOrderReporterOptions{options_.observer, options_.observer_delay_ms}),
      loaders_(source, LoaderFactoryOptions{options_.prefetch_batches, options_.prefetch_lookahead_bytes,
                                            options_.assembler},
               &reporter_),
      warm_jobs_(source, options_.max_warm_jobs, options_.warm) {
  ServeMetrics::Get();  // every family of the local service exists, at zero, from the start
}

LocalService::~LocalService() { Stop(); }

Status LocalService::Start() {
  if (started_) return FailedPrecondition("local service already started");
  const std::string& path = options_.socket_path;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof(addr.sun_path)) {
    return InvalidArgument("socket path '" + path + "' is empty or longer than " +
                           std::to_string(sizeof(addr.sun_path) - 1) + " bytes");
  }
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  const auto slash = path.rfind('/');
  if (slash != std::string::npos && slash > 0) SC_RETURN_IF_ERROR(MakeDirs(path.substr(0, slash)));

  struct stat st{};
  if (lstat(path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) {
      return FailedPrecondition("'" + path + "' exists and is not a socket; not removing it");
    }
    UniqueFd probe(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (::connect(probe.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
      return FailedPrecondition("another process is serving '" + path + "'");
    }
    spdlog::info("removing stale socket {}", path);
    if (::unlink(path.c_str()) != 0) return ErrnoStatus(errno, "removing stale socket " + path);
  }
  listen_fd_.Reset(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!listen_fd_.valid()) return ErrnoStatus(errno, "socket(AF_UNIX)");
  if (::bind(listen_fd_.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    return ErrnoStatus(errno, "bind " + path);
  }
  if (::chmod(path.c_str(), options_.socket_mode) != 0) return ErrnoStatus(errno, "chmod " + path);
  if (::listen(listen_fd_.get(), 128) != 0) return ErrnoStatus(errno, "listen " + path);
  stop_event_.Reset(::eventfd(0, EFD_CLOEXEC));
  if (!stop_event_.valid()) return ErrnoStatus(errno, "eventfd");
  warm_jobs_.Reopen();
  started_ = true;
  {
    MutexLock l(&retire_mu_);
    reaper_stop_ = false;
  }
  reaper_thread_ = std::thread([this] {
    NameThisThread("sc-reaper");
    ReaperLoop();
  });
  accept_thread_ = std::thread([this] {
    NameThisThread("sc-accept");
    AcceptLoop();
  });
  reporter_.Start();  // no thread without an observer
  spdlog::info("local service listening on {} (arena {} bytes in {} slots per client)", path,
               options_.arena_bytes, options_.slot_count);
  return Status::Ok();
}

void LocalService::Disconnect() {
  if (!started_ || disconnected_) return;
  disconnected_ = true;
  uint64_t one = 1;
  (void)!::write(stop_event_.get(), &one, sizeof(one));
  accept_thread_.join();
  // Warm jobs first: a connection thread answering WarmDataset right now is refused from here on.
  warm_jobs_.StopAll();
  MutexLock l(&mu_);
  // The client sees the daemon go at once (and reconnects to its successor); nothing it is
  // sent after this, such as the error of a read the stop cut short, reaches it.
  for (auto& c : connections_) c->Shutdown();
}

void LocalService::Stop() {
  if (!started_) return;
  Disconnect();
  started_ = false;
  disconnected_ = false;
  reporter_.Stop();
  std::list<std::unique_ptr<LocalSession>> conns;
  {
    MutexLock l(&mu_);
    conns.swap(connections_);
  }
  for (auto& c : conns) c->Join();
  conns.clear();
  {
    MutexLock l(&retire_mu_);
    reaper_stop_ = true;
  }
  retire_cv_.NotifyAll();
  reaper_thread_.join();  // after the retired loaders' reads ended (the caller shut the source down)
  ConnectionsGauge()->Set(0);
  listen_fd_.Reset();
  ::unlink(options_.socket_path.c_str());
}

void LocalService::ReapFinished() {
  std::list<std::unique_ptr<LocalSession>> finished;
  bool no_clients;
  {
    MutexLock l(&mu_);
    for (auto it = connections_.begin(); it != connections_.end();) {
      if ((*it)->done()) {
        finished.push_back(std::move(*it));
        it = connections_.erase(it);
      } else {
        ++it;
      }
    }
    ConnectionsGauge()->Set(static_cast<double>(connections_.size()));
    no_clients = connections_.empty();
  }
  for (auto& c : finished) c->Join();
  trim_pending_ = trim_pending_ || !finished.empty();
  if (!trim_pending_ || !no_clients) return;
  {
    MutexLock l(&retire_mu_);
    if (!retired_.empty()) return;  // the reaper still tears loaders down; next round
  }
  ReturnFreeHeapToKernel();
  trim_pending_ = false;
}

void LocalService::AcceptLoop() {
  for (;;) {
    pollfd fds[2] = {{listen_fd_.get(), POLLIN, 0}, {stop_event_.get(), POLLIN, 0}};
    // Wake now and then to join the threads of clients that went away.
    int r = ::poll(fds, 2, 200);
    ReapFinished();
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      spdlog::error("local service poll failed: {}", std::strerror(errno));
      return;
    }
    if (fds[1].revents) return;
    if (!(fds[0].revents & POLLIN)) continue;
    UniqueFd fd(::accept4(listen_fd_.get(), nullptr, nullptr, SOCK_CLOEXEC));
    if (!fd.valid()) {
      SC_LOG_RATE_LIMITED(spdlog::level::warn, "local service accept failed: {}", std::strerror(errno));
      continue;
    }
    auto peer = ReadPeerCredentials(fd.get());
    if (!peer.ok()) {
      SC_LOG_RATE_LIMITED(spdlog::level::warn, "local connection without peer credentials: {}",
                          peer.status().ToString());
      continue;
    }
    if (Status allowed = access_.Check(*peer); !allowed.ok()) {
      RefusedCounter()->Add();
      SC_LOG_RATE_LIMITED(spdlog::level::warn, "refusing local connection from pid {}: {}", peer->pid,
                          allowed.message());
      v1::LocalResponse refusal;
      SetLocalError(&refusal, allowed);
      (void)SendLocalResponse(fd.get(), refusal);
      continue;  // closes fd
    }
    Admit(std::move(fd), *peer);
  }
}

void LocalService::Admit(UniqueFd fd, const PeerCredentials& peer) {
  MutexLock l(&mu_);
  if (connections_.size() >= options_.max_connections) {
    RefusedCounter()->Add();
    SC_LOG_RATE_LIMITED(spdlog::level::warn, "refusing local connection from pid {}: {} connections open",
                        peer.pid, connections_.size());
    v1::LocalResponse refusal;
    SetLocalError(&refusal, ResourceExhausted("too many local connections (" +
                                              std::to_string(connections_.size()) + ")"));
    (void)SendLocalResponse(fd.get(), refusal);
    return;  // closes fd
  }
  SessionServices services;
  services.loaders = &loaders_;
  services.warm_jobs = &warm_jobs_;
  services.source = &source_;
  services.stats_json = [this] { return StatsJson(); };
  services.retire = [this](RetiredSession r) { Retire(std::move(r)); };
  services.checkpoints = options_.checkpoints;
  const LocalSessionOptions so{options_.arena_bytes, options_.slot_count, options_.next_timeout_ms};
  connections_.push_back(std::make_unique<LocalSession>(std::move(fd), peer, so, std::move(services)));
  ConnectionsGauge()->Set(static_cast<double>(connections_.size()));
  connections_.back()->Start();
}

void LocalService::Retire(RetiredSession r) {
  {
    MutexLock l(&retire_mu_);
    retired_.push_back(std::move(r));
  }
  retire_cv_.NotifyAll();
}

void LocalService::ReaperLoop() {
  MutexLock l(&retire_mu_);
  for (;;) {
    retire_cv_.Wait(&retire_mu_, [&]() REQUIRES(retire_mu_) { return reaper_stop_ || !retired_.empty(); });
    if (retired_.empty()) return;  // stopping, and nothing left
    RetiredSession r = std::move(retired_.front());
    l.Unlock();
    r.loaders.clear();  // loaders first: their reads write into the arena
    r.arena.reset();
    l.Lock();
    retired_.pop_front();
  }
}

size_t LocalService::connection_count() const {
  MutexLock l(&mu_);
  size_t n = 0;
  for (const auto& c : connections_) n += !c->done();
  return n;
}

size_t LocalService::loader_count() const {
  size_t n = 0;
  {
    MutexLock l(&retire_mu_);
    for (const RetiredSession& r : retired_) n += r.loaders.size();
  }
  MutexLock l(&mu_);
  for (const auto& c : connections_) n += c->loader_count();
  return n;
}

uint32_t LocalService::slots_in_use() const {
  MutexLock l(&mu_);
  uint32_t n = 0;
  for (const auto& c : connections_) n += c->slots_in_use();
  return n;
}

nlohmann::json LocalService::Stats() const {
  const ServeMetrics& m = ServeMetrics::Get();
  const DeliveredTotals delivered = SumDelivered();
  return {{"connections", connection_count()},
          {"loaders", loader_count()},
          {"slots_in_use", slots_in_use()},
          {"batches", delivered.batches},
          {"bytes", delivered.bytes},
          {"stall_us", delivered.stall_us},
          {"chunk_reads", m.chunk_reads->Value()},
          {"warm_reads", m.warm_reads->Value()},
          {"refused", m.refused_connections->Value()},
          {"warm_jobs", warm_jobs_.running()}};
}

std::string LocalService::StatsJson() const { return Stats().dump(); }

}  // namespace shardcache::serve
