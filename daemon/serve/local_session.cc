#include "daemon/serve/local_session.h"

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <chrono>

#include <spdlog/spdlog.h>

#include "common/log.h"
#include "common/thread_name.h"
#include "dataset/megatron_format.h"
#include "shardcache/batch_ring.h"
#include "shardcache/local.pb.h"
#include "shardcache/local_wire.h"

namespace shardcache::serve {
namespace {

// True once the peer closed or shut down its end of the socket (poll, no wait).
bool PeerGone(int fd) {
  pollfd p{fd, POLLRDHUP, 0};
  return ::poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
}

}  // namespace

Status SendLocalResponse(int fd, const v1::LocalResponse& r, int pass_fd) {
  std::string frame;
  local_wire::AppendFrame(r, &frame);
  return local_wire::WriteAll(fd, frame, pass_fd);
}

void SetLocalError(v1::LocalResponse* r, const Status& s) {
  r->Clear();
  r->set_code(static_cast<uint32_t>(s.code()));
  r->set_message(s.message());
}

LocalSession::LocalSession(UniqueFd fd, const PeerCredentials& peer, const LocalSessionOptions& options,
                           SessionServices services)
    : fd_(std::move(fd)),
      checkpoints_(services.checkpoints),
      who_("pid " + std::to_string(peer.pid) + " uid " + std::to_string(peer.uid)),
      options_(options),
      services_(std::move(services)) {}

void LocalSession::Start() {
  thread_ = std::thread([this] {
    NameThisThread("sc-session");
    Serve();
  });
}

void LocalSession::Join() {
  if (thread_.joinable()) thread_.join();
}

void LocalSession::Shutdown() {
  MutexLock l(&mu_);
  if (fd_.valid()) ::shutdown(fd_.get(), SHUT_RDWR);
  for (auto& [id, loader] : loaders_) loader->Cancel();  // wakes a waiting NextBatch
}

size_t LocalSession::loader_count() const {
  MutexLock l(&mu_);
  return loaders_.size();
}

uint32_t LocalSession::slots_in_use() const {
  MutexLock l(&mu_);
  return arena_ ? arena_->slot_count() - arena_->FreeSlots() : 0;
}

void LocalSession::Serve() {
  const int fd = fd_.get();
  spdlog::debug("local client connected: {}", who_);
  v1::LocalRequest req;
  v1::LocalResponse resp;
  std::string buf;
  local_wire::FrameReader reader(fd);
  for (;;) {
    if (Status s = reader.Next(&buf, nullptr); !s.ok()) {
      if (s.code() == StatusCode::kDataLoss) {
        SC_LOG_RATE_LIMITED(spdlog::level::warn, "local client {} sent {}; closing the connection", who_,
                            s.message());
      } else if (!reader.closed() && reader.error_number() != ECONNRESET) {
        spdlog::warn("local client {}: {}", who_, s.message());
      }
      break;
    }
    if (!req.ParseFromString(buf)) {
      SC_LOG_RATE_LIMITED(spdlog::level::warn,
                          "local client {} sent a malformed {}-byte request; closing the connection",
                          who_, buf.size());
      break;
    }
    resp.Clear();
    int pass_fd = -1;
    const Reply reply = Handle(req, &resp, &pass_fd);
    if (reply == Reply::kClose) break;
    if (reply == Reply::kNone) continue;
    const Status sent = SendLocalResponse(fd, resp, pass_fd);
    passing_.Reset();
    if (!sent.ok()) break;
  }
  Disconnected();
  spdlog::debug("local client disconnected: {}", who_);
  done_.store(true);
}

LocalSession::Reply LocalSession::Handle(const v1::LocalRequest& req, v1::LocalResponse* resp, int* pass_fd) {
  Status s;
  switch (req.body_case()) {
    case v1::LocalRequest::kHello:
      s = Hello(req.hello().protocol_version(), resp->mutable_hello(), pass_fd);
      break;
    case v1::LocalRequest::kOpenLoader:
      s = OpenLoader(req.open_loader(), resp->mutable_open_loader(), pass_fd);
      break;
    case v1::LocalRequest::kNextBatch:
      s = NextBatch(req.next_batch(), resp->mutable_next_batch());
      break;
    case v1::LocalRequest::kReleaseBatch:
      s = ReleaseBatch(req.release_batch().loader_id(), req.release_batch().slot());
      if (req.release_batch().no_reply()) {
        // A batch that outlives its loader releases a slot the close already freed.
        if (!s.ok()) spdlog::debug("local client {}: unanswered release: {}", who_, s.ToString());
        return Reply::kNone;
      }
      break;
    case v1::LocalRequest::kLoaderState:
      s = LoaderState(req.loader_state().loader_id(), resp->mutable_loader_state());
      break;
    case v1::LocalRequest::kCloseLoader:
      s = CloseLoader(req.close_loader().loader_id());
      if (s.ok()) resp->mutable_close_loader();
      break;
    case v1::LocalRequest::kStats:
      resp->mutable_stats()->set_json(services_.stats_json());
      break;
    case v1::LocalRequest::kWarmDataset:
      s = StartWarm(req.warm_dataset().dataset(), resp->mutable_warm_dataset());
      if (s.ok()) {
        spdlog::info("local client {} asked to warm '{}': warm {}{}", who_, req.warm_dataset().dataset(),
                     resp->warm_dataset().warm_id(), resp->warm_dataset().already_running() ? " (already running)" : "");
      }
      break;
    case v1::LocalRequest::kWarmStatus:
      s = services_.warm_jobs->Progress(req.warm_status().warm_id(), resp->mutable_warm_status());
      break;
    case v1::LocalRequest::kCheckpointOpen:
      s = checkpoints_.Open(req.checkpoint_open(), resp->mutable_checkpoint_open(), &passing_);
      *pass_fd = passing_.get();
      break;
    case v1::LocalRequest::kCheckpointCommit:
      s = checkpoints_.Commit(req.checkpoint_commit(), resp->mutable_checkpoint_commit());
      break;
    case v1::LocalRequest::kCheckpointStatus:
      s = checkpoints_.List(req.checkpoint_status(), resp->mutable_checkpoint_status());
      break;
    case v1::LocalRequest::kCheckpointRead:
      s = checkpoints_.Read(req.checkpoint_read(), resp->mutable_checkpoint_read(), &passing_);
      *pass_fd = passing_.get();
      break;
    default:
      SC_LOG_RATE_LIMITED(spdlog::level::warn, "local client {} sent an unknown request; closing", who_);
      return Reply::kClose;
  }
  if (!s.ok()) SetLocalError(resp, s);
  return Reply::kSend;
}

Status LocalSession::Hello(uint32_t version, v1::HelloResponse* h, int* pass_fd) {
  if (version < local_wire::kMinProtocolVersion || version > local_wire::kProtocolVersion) {
    return FailedPrecondition("client speaks local protocol " + std::to_string(version) + ", daemon speaks " +
                              std::to_string(local_wire::kMinProtocolVersion) + " to " +
                              std::to_string(local_wire::kProtocolVersion));
  }
  MutexLock l(&mu_);
  if (arena_) return FailedPrecondition("Hello sent twice on one connection");
  SC_ASSIGN_OR_RETURN(arena_, Arena::Create(options_.arena_bytes, options_.slot_count));
  protocol_version_ = version;
  h->set_protocol_version(version);  // the client's: every later addition is optional
  h->set_arena_bytes(arena_->arena_bytes());
  h->set_slot_count(arena_->slot_count());
  h->set_slot_bytes(arena_->slot_bytes());
  *pass_fd = arena_->fd();
  return Status::Ok();
}

Status LocalSession::OpenLoader(const v1::OpenLoaderRequest& request, v1::OpenLoaderResponse* r, int* pass_fd) {
  if (!arena_) return FailedPrecondition("OpenLoader before Hello");
  SC_ASSIGN_OR_RETURN(OpenedLoader opened, services_.loaders->Open(*arena_, request, protocol_version_));
  const LoaderPipeline& pipe = *opened.pipeline;
  const plan::RankSlice& slice = pipe.slice();
  const auto& m = opened.dataset->manifest;
  const uint64_t id = pipe.id();
  r->set_loader_id(id);
  r->set_version(opened.dataset->version);
  r->set_samples_per_epoch(slice.rank_samples());
  r->set_loader_samples(slice.size());
  r->set_record_bytes(m.format() == v1::RECORDS ? m.record_bytes() : 0);
  r->set_dataset_samples(m.total_samples());
  r->set_block_window_shards(slice.plan()->window_shards());
  r->set_format(m.format() == v1::RECORDS ? "records" : m.format() == v1::TAR ? "tar" : "megatron");
  r->set_sample_dtype(dataset::MegatronTokenDtype(m));
  if (const batch_ring::RingWriter* br = pipe.ring()) {
    r->set_ring_entries(br->entries());
    r->set_ring_bytes(br->bytes());
    *pass_fd = br->fd();  // sent before the loader could go away: only this thread closes it
  }
  MutexLock l(&mu_);
  loaders_[id] = std::move(opened.pipeline);
  return Status::Ok();
}

Status LocalSession::NextBatch(const v1::NextBatchRequest& req, v1::NextBatchResponse* r) {
  auto it = loaders_.find(req.loader_id());
  if (it == loaders_.end()) return NotFound("no open loader " + std::to_string(req.loader_id()));
  const uint32_t timeout_ms = std::min(kMaxNextTimeoutMs, req.timeout_ms() ? req.timeout_ms() : options_.next_timeout_ms);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  // A client that goes away while it waits frees its loaders and slots at once, not when its
  // timeout ends.
  const int fd = fd_.get();
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
    r->set_offset(arena_->SlotOffset(d.slot));
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

Status LocalSession::ReleaseBatch(uint64_t loader_id, uint32_t slot) {
  if (!arena_) return FailedPrecondition("ReleaseBatch before Hello");
  SC_RETURN_IF_ERROR(arena_->Release(slot, loader_id));
  // Only this thread changes loaders_.
  auto it = loaders_.find(loader_id);
  if (it != loaders_.end()) it->second->OnReleased();
  return Status::Ok();
}

Status LocalSession::LoaderState(uint64_t loader_id, v1::LoaderStateResponse* r) {
  auto it = loaders_.find(loader_id);
  if (it == loaders_.end()) return NotFound("no open loader " + std::to_string(loader_id));
  r->set_epoch(it->second->slice().plan()->options().epoch);
  r->set_samples_consumed(it->second->samples_consumed());
  return Status::Ok();
}

Status LocalSession::CloseLoader(uint64_t loader_id) {
  std::unique_ptr<LoaderPipeline> doomed;
  {
    MutexLock l(&mu_);
    auto it = loaders_.find(loader_id);
    if (it == loaders_.end()) return NotFound("no open loader " + std::to_string(loader_id));
    doomed = std::move(it->second);
    loaders_.erase(it);
  }
  doomed.reset();  // joins its thread and frees its slots
  return Status::Ok();
}

Status LocalSession::StartWarm(const std::string& dataset, v1::WarmDatasetResponse* r) {
  // The manifest first: over a grpc upstream it may take a round trip.
  auto ds = services_.source->OpenDataset(dataset);
  if (!ds.ok()) return ds.status().WithContext("warming dataset '" + dataset + "'");
  return services_.warm_jobs->Start(*ds, r);
}

void LocalSession::Disconnected() {
  RetiredSession gone;
  {
    MutexLock l(&mu_);
    gone.loaders.swap(loaders_);
    gone.arena = std::move(arena_);
  }
  for (auto& [id, loader] : gone.loaders) loader->Cancel();
  services_.retire(std::move(gone));
  {
    // Shutdown() shuts the socket down under mu_: never while it closes (the number could
    // already name another file).
    MutexLock l(&mu_);
    fd_.Reset();
  }
}

}  // namespace shardcache::serve
