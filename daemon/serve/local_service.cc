#include "daemon/serve/local_service.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "common/malloc_tuning.h"
#include "common/log.h"
#include "common/metrics.h"
#include "daemon/serve/arena.h"
#include "daemon/serve/loader_request.h"
#include "daemon/serve/serve_metrics.h"
#include "dataset/megatron_format.h"
#include "shardcache/batch_ring.h"
#include "shardcache/local.pb.h"
#include "shardcache/local_wire.h"

namespace shardcache::serve {
namespace {

metrics::Counter* RefusedCounter() { return ServeMetrics::Get().refused_connections; }
metrics::Gauge* ConnectionsGauge() { return ServeMetrics::Get().connections; }

// True once the peer closed or shut down its end of the socket (poll, no wait).
bool PeerGone(int fd) {
  pollfd p{fd, POLLRDHUP, 0};
  return ::poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
}

Status SendResponse(int fd, const v1::LocalResponse& r, int pass_fd = -1) {
  std::string frame;
  local_wire::AppendFrame(r, &frame);
  return local_wire::WriteAll(fd, frame, pass_fd);
}

void SetError(v1::LocalResponse* r, const Status& s) {
  r->Clear();
  r->set_code(static_cast<uint32_t>(s.code()));
  r->set_message(s.message());
}

}  // namespace

struct LocalService::Connection {
  UniqueFd fd;
  pid_t pid = 0;
  uid_t uid = 0;
  gid_t gid = 0;
  uint32_t protocol_version = 0;  // the Hello's; only this connection's thread touches it
  std::thread thread;
  std::atomic<bool> done{false};

  mutable Mutex mu;  // guards arena (set once) and loaders for readers on other threads
  std::unique_ptr<Arena> arena;
  std::map<uint64_t, std::unique_ptr<LoaderPipeline>> loaders;
};

LocalService::LocalService(ChunkSource& source, LocalServiceOptions options)
    : source_(source),
      options_(std::move(options)),
      access_(PeerAccessOptions{options_.allowed_uids, options_.allowed_gids, options_.allowed_groups,
                                options_.allow_root_and_self}),
      assembler_(source, options_.assembler),
      lookahead_bytes_(options_.prefetch_lookahead_bytes),
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
  reaper_thread_ = std::thread([this] { ReaperLoop(); });
  accept_thread_ = std::thread([this] { AcceptLoop(); });
  if (options_.observer) {
    {
      MutexLock l(&observer_mu_);
      observer_stop_ = false;
    }
    observer_thread_ = std::thread([this] { ObserverLoop(); });
  }
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
  stopping_ = true;
  for (auto& c : connections_) {
    // The client sees the daemon go at once (and reconnects to its successor); nothing it is
    // sent after this, such as the error of a read the stop cut short, reaches it.
    ::shutdown(c->fd.get(), SHUT_RDWR);
    MutexLock cl(&c->mu);
    for (auto& [id, loader] : c->loaders) loader->Cancel();  // wakes a waiting NextBatch
  }
}

void LocalService::Stop() {
  if (!started_) return;
  Disconnect();
  started_ = false;
  disconnected_ = false;
  if (observer_thread_.joinable()) {
    {
      MutexLock l(&observer_mu_);
      observer_stop_ = true;
    }
    observer_cv_.NotifyAll();
    observer_thread_.join();
  }
  std::list<std::unique_ptr<Connection>> conns;
  {
    MutexLock l(&mu_);
    conns.swap(connections_);
  }
  for (auto& c : conns) c->thread.join();
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
  {
    MutexLock l(&mu_);
    stopping_ = false;
  }
}

void LocalService::ReapFinished() {
  std::list<std::unique_ptr<Connection>> finished;
  bool no_clients;
  {
    MutexLock l(&mu_);
    for (auto it = connections_.begin(); it != connections_.end();) {
      if ((*it)->done.load()) {
        finished.push_back(std::move(*it));
        it = connections_.erase(it);
      } else {
        ++it;
      }
    }
    ConnectionsGauge()->Set(static_cast<double>(connections_.size()));
    no_clients = connections_.empty();
  }
  for (auto& c : finished) c->thread.join();
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
    const PeerCredentials& cred = *peer;
    v1::LocalResponse refusal;
    if (Status allowed = access_.Check(cred); !allowed.ok()) {
      RefusedCounter()->Add();
      SC_LOG_RATE_LIMITED(spdlog::level::warn, "refusing local connection from pid {}: {}", cred.pid,
                          allowed.message());
      SetError(&refusal, allowed);
      (void)SendResponse(fd.get(), refusal);
      continue;  // closes fd
    }
    MutexLock l(&mu_);
    if (connections_.size() >= options_.max_connections) {
      RefusedCounter()->Add();
      SC_LOG_RATE_LIMITED(spdlog::level::warn, "refusing local connection from pid {}: {} connections open",
                          cred.pid, connections_.size());
      SetError(&refusal, ResourceExhausted("too many local connections (" +
                                           std::to_string(connections_.size()) + ")"));
      (void)SendResponse(fd.get(), refusal);
      continue;
    }
    auto c = std::make_unique<Connection>();
    c->fd = std::move(fd);
    c->pid = cred.pid;
    c->uid = cred.uid;
    c->gid = cred.gid;
    Connection* raw = c.get();
    connections_.push_back(std::move(c));
    ConnectionsGauge()->Set(static_cast<double>(connections_.size()));
    raw->thread = std::thread([this, raw] { Serve(raw); });
  }
}

Result<std::shared_ptr<SampleLocator>> LocalService::LocatorFor(const DatasetPtr& dataset) {
  MutexLock l(&mu_);
  auto& w = locators_[dataset->version];
  if (auto p = w.lock()) return p;
  auto p = std::make_shared<SampleLocator>(source_, dataset);
  w = p;
  return p;
}

std::string LocalService::PlanKey(const DatasetPtr& dataset, const plan::PlanOptions& o) {
  // The window as resolved: plans of different world sizes with the same window are one order.
  return dataset->version + "/" + std::to_string(o.seed) + "/" + std::to_string(o.epoch) + "/" +
         plan::ShuffleModeName(o.mode) + "/" +
         std::to_string(plan::ResolveBlockWindow(plan::LayoutOf(*dataset), o));
}

Status LocalService::OpenLoader(Connection* c, const v1::OpenLoaderRequest& request,
                                v1::OpenLoaderResponse* r, int* pass_fd) {
  if (!c->arena) return FailedPrecondition("OpenLoader before Hello");
  SC_ASSIGN_OR_RETURN(LoaderRequest o, CheckOpenLoader(request, c->protocol_version));
  SC_ASSIGN_OR_RETURN(DatasetPtr ds, source_.OpenDataset(o.dataset));
  if (!o.expect_version.empty() && o.expect_version != ds->version) {
    return FailedPrecondition("dataset '" + o.dataset + "' is at version " + ds->version +
                              ", but the loader resumes a state of version " + o.expect_version +
                              " (the dataset was re-indexed since the state was saved)");
  }
  const auto& m = ds->manifest;
  const uint64_t record_bytes = m.format() == v1::RECORDS ? m.record_bytes() : 0;
  const uint32_t batch_size = o.slice.batch_size;
  if (record_bytes > 0 && record_bytes * batch_size > c->arena->slot_bytes()) {
    return ResourceExhausted("a batch of " + std::to_string(batch_size) + " records of " +
                             std::to_string(record_bytes) + " bytes does not fit a " +
                             std::to_string(c->arena->slot_bytes()) + "-byte arena slot");
  }
  SC_ASSIGN_OR_RETURN(auto plan, PlanFor(ds, o.plan));
  SC_ASSIGN_OR_RETURN(plan::RankSlice slice, plan::RankSlice::Make(plan, o.slice));
  SC_ASSIGN_OR_RETURN(auto locator, LocatorFor(ds));
  LoaderPipelineOptions lo;
  lo.prefetch_batches = options_.prefetch_batches;
  lo.lookahead_bytes_live = &lookahead_bytes_;
  lo.fields = o.fields;
  std::unique_ptr<batch_ring::RingWriter> ring;
  if (o.ring) {
    // A ring loader holds at most half the arena, so a client's second loader always finds
    // slots (loaders of protocol 1-2 clients keep their old, unlimited share).
    lo.max_slots = std::max(1u, c->arena->slot_count() / 2);
    SC_ASSIGN_OR_RETURN(ring, batch_ring::RingWriter::Create(RingEntriesFor(lo.max_slots, batch_size), batch_size));
  }
  // The bytes a batch fills (records: exactly; other formats: the average sample, with a
  // quarter more for the spread), faulted in before the first batch is assembled. (In floating
  // point: a hostile batch_size must not overflow it; the arena caps it.)
  const double batch_bytes =
      record_bytes > 0 ? double(record_bytes) * batch_size
                       : double(m.total_bytes()) / double(std::max<uint64_t>(1, m.total_samples())) * batch_size * 1.25;
  c->arena->PrefaultFronts(static_cast<uint64_t>(std::min(batch_bytes, double(c->arena->slot_bytes()))),
                           kOpenPrefaultBytes);
  const uint64_t id = next_loader_id_++;
  auto pipe = std::make_unique<LoaderPipeline>(id, *c->arena, assembler_, locator, slice, lo, std::move(ring));
  if (options_.observer) NoteLoaderForObserver(ds, locator, slice);
  r->set_loader_id(id);
  r->set_version(ds->version);
  r->set_samples_per_epoch(slice.rank_samples());
  r->set_loader_samples(slice.size());
  r->set_record_bytes(record_bytes);
  r->set_dataset_samples(m.total_samples());
  r->set_block_window_shards(plan->window_shards());
  r->set_format(m.format() == v1::RECORDS ? "records" : m.format() == v1::TAR ? "tar" : "megatron");
  r->set_sample_dtype(dataset::MegatronTokenDtype(m));
  if (const batch_ring::RingWriter* br = pipe->ring()) {
    r->set_ring_entries(br->entries());
    r->set_ring_bytes(br->bytes());
    *pass_fd = br->fd();  // sent before the loader could go away: only this thread closes it
  }
  MutexLock l(&c->mu);
  c->loaders[id] = std::move(pipe);
  return Status::Ok();
}

void LocalService::NoteLoaderForObserver(const DatasetPtr& dataset, const std::shared_ptr<SampleLocator>& locator,
                                         const plan::RankSlice& slice) {
  const plan::SliceOptions& so = slice.options();
  const std::string key = PlanKey(dataset, slice.plan()->options()) + "/" + std::to_string(so.world_size) + "/" +
                          std::to_string(so.start_position);
  {
    MutexLock l(&observer_mu_);
    PlanUse& u = plan_uses_[key];
    u.dataset = dataset;
    u.locator = locator;
    u.plan = slice.plan();
    u.world_size = so.world_size;
    u.start_position = so.start_position;
    auto [it, inserted] = u.rank_start.emplace(so.rank, so.rank_start);
    if (!inserted && so.rank_start >= it->second) return;  // nothing new to report
    it->second = std::min(it->second, so.rank_start);
    u.dirty = true;
  }
  observer_cv_.NotifyAll();
}

void LocalService::ObserverLoop() {
  MutexLock l(&observer_mu_);
  for (;;) {
    observer_cv_.Wait(&observer_mu_, [&]() REQUIRES(observer_mu_) {
      if (observer_stop_) return true;
      for (auto& [k, u] : plan_uses_) if (u.dirty) return true;
      return false;
    });
    if (observer_stop_) return;
    // Let the other ranks of the job open before computing.
    observer_cv_.WaitFor(&observer_mu_, std::chrono::milliseconds(options_.observer_delay_ms),
                         [&]() REQUIRES(observer_mu_) { return observer_stop_; });
    if (observer_stop_) return;
    std::vector<PlanUse> todo;
    for (auto it = plan_uses_.begin(); it != plan_uses_.end();) {
      if (it->second.plan.expired()) {
        it = plan_uses_.erase(it);
        continue;
      }
      if (it->second.dirty) {
        it->second.dirty = false;
        todo.push_back(it->second);
      }
      ++it;
    }
    l.Unlock();
    for (const PlanUse& u : todo) {
      auto plan = u.plan.lock();
      auto locator = u.locator.lock();
      if (!plan || !locator) continue;
      const uint64_t w = u.world_size, first = u.start_position;
      uint64_t from = UINT64_MAX;
      for (auto& [rank, start] : u.rank_start) from = std::min(from, first + start * w);
      std::vector<ChunkAccess> order;
      const uint64_t cb = u.dataset->manifest.chunk_bytes();
      auto add = [&](uint64_t id) {
        auto e = locator->Locate(id);
        if (!e.ok() || e->length == 0) return;
        for (uint64_t c = e->offset / cb; c <= (e->offset + e->length - 1) / cb; ++c) {
          if (!order.empty() && order.back().shard == e->shard && order.back().chunk == c) continue;
          order.push_back({e->shard, c});
        }
      };
      // Padding and a dropped tail are a few samples either way: the global order decides.
      for (uint64_t p = from; p < plan->dataset_samples(); ++p) {
        if (u.rank_start.count(static_cast<uint32_t>((p - first) % w))) add(plan->AtPosition(p));
      }
      auto next_opts = plan->options();
      next_opts.epoch += 1;
      if (auto next = plan::EpochPlan::Make(plan::LayoutOf(*u.dataset), next_opts); next.ok()) {
        for (uint64_t p = 0; p < (*next)->dataset_samples(); ++p) {
          if (u.rank_start.count(static_cast<uint32_t>(p % w))) add((*next)->AtPosition(p));
        }
      }
      options_.observer(u.dataset, order);
    }
    l.Lock();
  }
}

uint32_t RingEntriesFor(uint32_t max_slots, uint32_t batch_size) {
  uint32_t entries = std::max(1u, std::min(max_slots, kRingEntries));
  while (entries > 1 && batch_ring::RingBytes(entries, batch_size) > batch_ring::kMaxRingBytes) entries /= 2;
  return entries;
}

Result<std::shared_ptr<const plan::EpochPlan>> LocalService::PlanFor(const DatasetPtr& dataset,
                                                                     const plan::PlanOptions& o) {
  const std::string key = PlanKey(dataset, o);
  {
    MutexLock l(&mu_);
    for (auto it = plans_.begin(); it != plans_.end();) {
      it = it->second.expired() ? plans_.erase(it) : std::next(it);
    }
    if (auto it = plans_.find(key); it != plans_.end()) {
      if (auto p = it->second.lock()) return p;
    }
  }
  // Built outside the lock: a plan of millions of samples takes a moment.
  SC_ASSIGN_OR_RETURN(auto p, plan::EpochPlan::Make(plan::LayoutOf(*dataset), o));
  MutexLock l(&mu_);
  if (auto it = plans_.find(key); it != plans_.end()) {
    if (auto existing = it->second.lock()) return existing;
  }
  plans_[key] = p;
  return p;
}

void LocalService::Serve(Connection* c) {
  const int fd = c->fd.get();
  const std::string who = "pid " + std::to_string(c->pid) + " uid " + std::to_string(c->uid);
  spdlog::debug("local client connected: {}", who);
  v1::LocalRequest req;
  v1::LocalResponse resp;
  std::string buf;
  local_wire::FrameReader reader(fd);
  for (;;) {
    if (Status s = reader.Next(&buf, nullptr); !s.ok()) {
      if (s.code() == StatusCode::kDataLoss) {
        SC_LOG_RATE_LIMITED(spdlog::level::warn, "local client {} sent {}; closing the connection", who,
                            s.message());
      } else if (!reader.closed() && reader.error_number() != ECONNRESET) {
        spdlog::warn("local client {}: {}", who, s.message());
      }
      break;
    }
    if (!req.ParseFromString(buf)) {
      SC_LOG_RATE_LIMITED(spdlog::level::warn,
                          "local client {} sent a malformed {}-byte request; closing the connection",
                          who, buf.size());
      break;
    }
    resp.Clear();
    int pass_fd = -1;
    const Reply reply = Handle(c, who, req, &resp, &pass_fd);
    if (reply == Reply::kClose) break;
    if (reply == Reply::kNone) continue;
    if (!SendResponse(fd, resp, pass_fd).ok()) break;
  }
  Disconnected(c);
  spdlog::debug("local client disconnected: {}", who);
  c->done.store(true);
}

LocalService::Reply LocalService::Handle(Connection* c, const std::string& who, const v1::LocalRequest& req,
                                         v1::LocalResponse* resp, int* pass_fd) {
  Status s;
  switch (req.body_case()) {
    case v1::LocalRequest::kHello:
      s = Hello(c, req.hello().protocol_version(), resp->mutable_hello(), pass_fd);
      break;
    case v1::LocalRequest::kOpenLoader:
      s = OpenLoader(c, req.open_loader(), resp->mutable_open_loader(), pass_fd);
      break;
    case v1::LocalRequest::kNextBatch:
      s = NextBatch(c, req.next_batch(), resp->mutable_next_batch());
      break;
    case v1::LocalRequest::kReleaseBatch:
      s = ReleaseBatch(c, req.release_batch().loader_id(), req.release_batch().slot());
      if (req.release_batch().no_reply()) {
        // A batch that outlives its loader releases a slot the close already freed.
        if (!s.ok()) spdlog::debug("local client {}: unanswered release: {}", who, s.ToString());
        return Reply::kNone;
      }
      break;
    case v1::LocalRequest::kLoaderState: {
      auto it = c->loaders.find(req.loader_state().loader_id());
      if (it == c->loaders.end()) {
        s = NotFound("no open loader " + std::to_string(req.loader_state().loader_id()));
        break;
      }
      resp->mutable_loader_state()->set_epoch(it->second->slice().plan()->options().epoch);
      resp->mutable_loader_state()->set_samples_consumed(it->second->samples_consumed());
      break;
    }
    case v1::LocalRequest::kCloseLoader:
      s = CloseLoader(c, req.close_loader().loader_id());
      if (s.ok()) resp->mutable_close_loader();
      break;
    case v1::LocalRequest::kStats:
      resp->mutable_stats()->set_json(StatsJson());
      break;
    case v1::LocalRequest::kWarmDataset:
      s = StartWarm(req.warm_dataset().dataset(), resp->mutable_warm_dataset());
      if (s.ok()) {
        spdlog::info("local client {} asked to warm '{}': warm {}{}", who, req.warm_dataset().dataset(),
                     resp->warm_dataset().warm_id(), resp->warm_dataset().already_running() ? " (already running)" : "");
      }
      break;
    case v1::LocalRequest::kWarmStatus:
      s = warm_jobs_.Progress(req.warm_status().warm_id(), resp->mutable_warm_status());
      break;
    default:
      SC_LOG_RATE_LIMITED(spdlog::level::warn, "local client {} sent an unknown request; closing", who);
      return Reply::kClose;
  }
  if (!s.ok()) SetError(resp, s);
  return Reply::kSend;
}

Status LocalService::Hello(Connection* c, uint32_t version, v1::HelloResponse* h, int* pass_fd) {
  if (version < local_wire::kMinProtocolVersion || version > local_wire::kProtocolVersion) {
    return FailedPrecondition("client speaks local protocol " + std::to_string(version) + ", daemon speaks " +
                              std::to_string(local_wire::kMinProtocolVersion) + " to " +
                              std::to_string(local_wire::kProtocolVersion));
  }
  MutexLock l(&c->mu);
  if (c->arena) return FailedPrecondition("Hello sent twice on one connection");
  SC_ASSIGN_OR_RETURN(c->arena, Arena::Create(options_.arena_bytes, options_.slot_count));
  c->protocol_version = version;
  h->set_protocol_version(version);  // the client's: every later addition is optional
  h->set_arena_bytes(c->arena->arena_bytes());
  h->set_slot_count(c->arena->slot_count());
  h->set_slot_bytes(c->arena->slot_bytes());
  *pass_fd = c->arena->fd();
  return Status::Ok();
}

Status LocalService::NextBatch(Connection* c, const v1::NextBatchRequest& req, v1::NextBatchResponse* r) {
  auto it = c->loaders.find(req.loader_id());
  if (it == c->loaders.end()) return NotFound("no open loader " + std::to_string(req.loader_id()));
  const uint32_t timeout_ms = std::min(kMaxNextTimeoutMs, req.timeout_ms() ? req.timeout_ms() : options_.next_timeout_ms);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  // A client that goes away while it waits frees its loaders and slots at once, not when its
  // timeout ends.
  const int fd = c->fd.get();
  const auto gone = [fd] { return PeerGone(fd); };
  if (req.ring()) {
    SC_ASSIGN_OR_RETURN(auto w, it->second->WaitPublished(req.ring_index(), deadline, gone));
    r->set_end_of_epoch(w.end_of_epoch);
    r->set_ring_published(w.published);
    r->set_wait_us(w.wait_us);
    return Status::Ok();
  }
  SC_ASSIGN_OR_RETURN(auto d, it->second->Next(deadline, gone));
  r->set_end_of_epoch(d.end_of_epoch);
  if (!d.end_of_epoch) {
    r->set_slot(d.slot);
    r->set_offset(c->arena->SlotOffset(d.slot));
    r->set_payload_bytes(d.batch.payload_bytes);
    *r->mutable_sample_offsets() = {d.batch.offsets.begin(), d.batch.offsets.end()};
    *r->mutable_sample_lengths() = {d.batch.lengths.begin(), d.batch.lengths.end()};
    *r->mutable_sample_ids() = {d.batch.sample_ids.begin(), d.batch.sample_ids.end()};
    r->set_batch_seq(d.seq);
    r->set_record_bytes(it->second->record_bytes());
    r->set_wait_us(d.wait_us);
  }
  return Status::Ok();
}

Status LocalService::ReleaseBatch(Connection* c, uint64_t loader_id, uint32_t slot) {
  if (!c->arena) return FailedPrecondition("ReleaseBatch before Hello");
  SC_RETURN_IF_ERROR(c->arena->Release(slot, loader_id));
  // Only this thread changes c->loaders.
  auto it = c->loaders.find(loader_id);
  if (it != c->loaders.end()) it->second->OnReleased();
  return Status::Ok();
}

Status LocalService::CloseLoader(Connection* c, uint64_t loader_id) {
  std::unique_ptr<LoaderPipeline> doomed;
  {
    MutexLock l(&c->mu);
    auto it = c->loaders.find(loader_id);
    if (it == c->loaders.end()) return NotFound("no open loader " + std::to_string(loader_id));
    doomed = std::move(it->second);
    c->loaders.erase(it);
  }
  doomed.reset();  // joins its thread and frees its slots
  return Status::Ok();
}

void LocalService::Disconnected(Connection* c) {
  Retired gone;
  {
    MutexLock l(&c->mu);
    gone.loaders.swap(c->loaders);
    gone.arena = std::move(c->arena);
  }
  for (auto& [id, loader] : gone.loaders) loader->Cancel();
  Retire(std::move(gone));
  {
    // Disconnect() shuts client sockets down under mu_: never while this one closes (the number
    // could already name another file).
    MutexLock l(&mu_);
    c->fd.Reset();
  }
}

void LocalService::Retire(Retired r) {
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
    Retired r = std::move(retired_.front());
    l.Unlock();
    r.loaders.clear();  // loaders first: their reads write into the arena
    r.arena.reset();
    l.Lock();
    retired_.pop_front();
  }
}

Status LocalService::StartWarm(const std::string& dataset, v1::WarmDatasetResponse* r) {
  // The manifest first: over a grpc upstream it may take a round trip.
  auto ds = source_.OpenDataset(dataset);
  if (!ds.ok()) return ds.status().WithContext("warming dataset '" + dataset + "'");
  return warm_jobs_.Start(*ds, r);
}

size_t LocalService::connection_count() const {
  MutexLock l(&mu_);
  size_t n = 0;
  for (const auto& c : connections_) n += !c->done.load();
  return n;
}

size_t LocalService::loader_count() const {
  size_t n = 0;
  {
    MutexLock l(&retire_mu_);
    for (const Retired& r : retired_) n += r.loaders.size();
  }
  MutexLock l(&mu_);
  for (const auto& c : connections_) {
    MutexLock cl(&c->mu);
    n += c->loaders.size();
  }
  return n;
}

uint32_t LocalService::slots_in_use() const {
  MutexLock l(&mu_);
  uint32_t n = 0;
  for (const auto& c : connections_) {
    MutexLock cl(&c->mu);
    if (c->arena) n += c->arena->slot_count() - c->arena->FreeSlots();
  }
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
