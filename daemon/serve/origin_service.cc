#include "daemon/serve/origin_service.h"


#include <algorithm>
#include <deque>
#include <thread>

#include <spdlog/spdlog.h>

#include "common/allocator.h"
#include "common/hash.h"
#include "common/log.h"
#include "common/metrics.h"
#include "common/thread_name.h"

namespace shardcache::serve {
namespace {

using Clock = std::chrono::steady_clock;

// Most block ranges one ReadChunks request may add (origin.proto: more_ranges).
constexpr int kMaxMoreRanges = 255;

struct OriginMetrics {
  metrics::Counter* chunks;
  metrics::Counter* payload_bytes;
  metrics::Counter* wire_bytes;
  metrics::Gauge* ratio;
};

const OriginMetrics& M() {
  static const OriginMetrics m = [] {
    auto& r = metrics::Registry::Global();
    return OriginMetrics{
        r.GetCounter("shardcache_origin_chunks_total", "Chunks sent to downstream daemons"),
        r.GetCounter("shardcache_origin_payload_bytes_total",
                     "Raw chunk bytes sent to downstream daemons (before zstd)"),
        r.GetCounter("shardcache_origin_wire_bytes_total",
                     "Chunk payload bytes as sent to downstream daemons (after zstd)"),
        r.GetGauge("shardcache_origin_compression_ratio",
                   "Raw over sent chunk bytes since start (1.0 = nothing saved)"),
    };
  }();
  return m;
}

metrics::Counter* RequestCounter(const char* method, grpc::StatusCode code) {
  return metrics::Registry::Global().GetCounter(
      "shardcache_origin_requests_total", "Origin service calls by method and result",
      {{"method", method}, {"code", StatusCodeName(static_cast<StatusCode>(code))}});
}

void CountRequest(const char* method, const grpc::Status& s) { RequestCounter(method, s.error_code())->Add(); }

void CountBytes(uint64_t raw, uint64_t wire) {
  M().chunks->Add();
  M().payload_bytes->Add(raw);
  M().wire_bytes->Add(wire);
  const double w = static_cast<double>(M().wire_bytes->Value());
  if (w > 0) M().ratio->Set(static_cast<double>(M().payload_bytes->Value()) / w);
}

// The token of an "authorization: Bearer <token>" header; "" when there is none.
std::string BearerToken(const grpc::ServerContextBase& ctx) {
  constexpr std::string_view kScheme = "Bearer ";
  const auto& md = ctx.client_metadata();
  const auto it = md.find("authorization");
  if (it == md.end()) return "";
  const std::string_view value(it->second.data(), it->second.size());
  if (!value.starts_with(kScheme)) return "";
  return std::string(value.substr(kScheme.size()));
}

// Moves a call's result into its response message.
template <class T>
Status Deliver(Result<T> r, T* resp) {
  if (r.ok()) *resp = std::move(*r);
  return r.status();
}

Clock::time_point DeadlineOf(const grpc::CallbackServerContext& ctx, std::chrono::seconds max) {
  const auto sys_now = std::chrono::system_clock::now();
  const auto now = Clock::now();
  const auto d = ctx.deadline();
  if (d >= sys_now + max) return now + max;
  return now + std::chrono::duration_cast<Clock::duration>(d - sys_now);
}

}  // namespace

grpc::Status ToGrpcStatus(const Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), s.message());
}

OriginService::OriginService(ChunkSource& source, OriginServiceOptions options)
    : source_(source), options_(std::move(options)), auth_(options_.token), store_(options_.checkpoints) {
  // Every family exists, at zero, from the start; requests_total with one series per method.
  M();
  for (const char* method : {"ListDatasets", "GetManifest", "GetSampleIndex", "ReadChunks", "BeginUpload", "PutPart",
                             "CommitUpload", "StatObject", "ReadPart"}) {
    RequestCounter(method, grpc::StatusCode::OK);
  }
}

OriginService::~OriginService() {
  MutexLock lock(&mu_);
  cv_.Wait(&mu_, [&]() REQUIRES(mu_) { return threads_ == 0; });
}

grpc::Status OriginService::Admit(const grpc::CallbackServerContext& ctx, std::string* client) {
  if (grpc::Status a = auth_.Check(ctx); !a.ok()) return a;
  return TakePlace(ctx, client);
}

grpc::Status OriginService::TakePlace(const grpc::CallbackServerContext& ctx, std::string* client) {
  // The client's address without its port: "ipv4:10.0.0.7:51234" -> "ipv4:10.0.0.7".
  *client = ctx.peer();
  if (const size_t colon = client->rfind(':'); colon != std::string::npos && colon > client->find(':')) {
    client->resize(colon);
  }
  MutexLock lock(&mu_);
  uint32_t& mine = calls_by_client_[*client];
  if (calls_ >= options_.max_calls || mine >= options_.max_calls_per_client) {
    const bool global = calls_ >= options_.max_calls;
    if (mine == 0) calls_by_client_.erase(*client);
    return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                        global ? "this origin runs " + std::to_string(calls_) + " calls, its limit; retry later"
                               : "client " + *client + " has " + std::to_string(options_.max_calls_per_client) +
                                     " calls running, the limit per client");
  }
  ++mine;
  ++calls_;
  return grpc::Status::OK;
}

void OriginService::Spawn(std::string client, std::function<void()> fn) {
  {
    MutexLock lock(&mu_);
    ++threads_;
  }
  std::thread([this, client = std::move(client), fn = std::move(fn)] {
    NameThisThread("sc-origin-call");
    fn();
    bool idle = false;
    {
      MutexLock lock(&mu_);
      if (auto it = calls_by_client_.find(client); it != calls_by_client_.end() && --it->second == 0) {
        calls_by_client_.erase(it);
      }
      --calls_;
      idle = calls_ == 0;
      if (--threads_ == 0) cv_.NotifyAll();
    }
    // A burst of calls is over: hand the buffers it freed back to the kernel.
    if (idle) ReturnFreeHeapToKernel();
  }).detach();
}

uint32_t OriginService::calls_running() {
  MutexLock lock(&mu_);
  return calls_;
}

bool OriginService::ReserveQueued(uint64_t bytes, bool first_of_stream) {
  MutexLock lock(&mu_);
  if (!first_of_stream && queued_bytes_ + bytes > options_.max_queued_bytes) return false;
  queued_bytes_ += bytes;
  return true;
}

void OriginService::ReleaseQueued(uint64_t bytes) {
  MutexLock lock(&mu_);
  queued_bytes_ -= bytes;
}

Result<DatasetPtr> OriginService::OpenVersion(const std::string& name, const std::string& version) {
  if (DatasetPtr known = versions_.Find(name, version)) return known;
  SC_ASSIGN_OR_RETURN(DatasetPtr d, source_.OpenDataset(name));
  versions_.Remember(d);
  if (!version.empty() && version != d->version) {
    return FailedPrecondition("dataset '" + d->name + "' is at version " + d->version +
                              ", the request names version " + version +
                              ", which this daemon no longer serves");
  }
  return d;
}

grpc::ServerUnaryReactor* OriginService::ListDatasets(grpc::CallbackServerContext* ctx,
                                                      const v1::ListDatasetsRequest*,
                                                      v1::ListDatasetsResponse* resp) {
  auto* reactor = ctx->DefaultReactor();
  std::string client;
  if (grpc::Status a = Admit(*ctx, &client); !a.ok()) {
    CountRequest("ListDatasets", a);
    reactor->Finish(a);
    return reactor;
  }
  Spawn(std::move(client), [this, reactor, resp] {
    auto r = source_.ListDatasets();
    grpc::Status s = ToGrpcStatus(r.status());
    if (r.ok()) {
      for (auto& d : *r) *resp->add_datasets() = std::move(d);
    }
    CountRequest("ListDatasets", s);
    reactor->Finish(s);
  });
  return reactor;
}

grpc::ServerUnaryReactor* OriginService::GetManifest(grpc::CallbackServerContext* ctx,
                                                     const v1::GetManifestRequest* req,
                                                     v1::GetManifestResponse* resp) {
  auto* reactor = ctx->DefaultReactor();
  if (req->dataset().empty()) {
    // Downstream daemons' health probe (upstream_health.h): answered here, without a thread, a
    // place among the calls, or a look at the source.
    grpc::Status s = auth_.Check(*ctx);
    if (s.ok()) s = grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "empty dataset name");
    CountRequest("GetManifest", s);
    reactor->Finish(s);
    return reactor;
  }
  std::string client;
  if (grpc::Status a = Admit(*ctx, &client); !a.ok()) {
    CountRequest("GetManifest", a);
    reactor->Finish(a);
    return reactor;
  }
  Spawn(std::move(client), [this, reactor, req, resp] {
    auto d = source_.OpenDataset(req->dataset());
    if (d.ok()) versions_.Remember(*d);
    grpc::Status s = ToGrpcStatus(d.status());
    if (d.ok()) {
      resp->set_manifest((*d)->manifest_bytes);
      resp->set_version((*d)->version);
    }
    CountRequest("GetManifest", s);
    reactor->Finish(s);
  });
  return reactor;
}

grpc::ServerUnaryReactor* OriginService::GetSampleIndex(grpc::CallbackServerContext* ctx,
                                                        const v1::GetSampleIndexRequest* req,
                                                        v1::GetSampleIndexResponse* resp) {
  auto* reactor = ctx->DefaultReactor();
  std::string client;
  if (grpc::Status a = Admit(*ctx, &client); !a.ok()) {
    CountRequest("GetSampleIndex", a);
    reactor->Finish(a);
    return reactor;
  }
  Spawn(std::move(client), [this, reactor, req, resp] {
    Status st = [&]() -> Status {
      SC_ASSIGN_OR_RETURN(DatasetPtr d, OpenVersion(req->dataset(), req->version()));
      SC_ASSIGN_OR_RETURN(std::string bytes, source_.GetSampleIndex(d, req->shard()));
      resp->set_sample_index(std::move(bytes));
      return Status::Ok();
    }();
    grpc::Status s = ToGrpcStatus(st);
    CountRequest("GetSampleIndex", s);
    reactor->Finish(s);
  });
  return reactor;
}

// One ReadChunks call. The producer thread reads from the source and encodes; the reactor
// writes. Shared state is guarded by mu_. Invariants: at most one write in flight
// (writing_), Finish is called exactly once and only after the producer is done, so no
// reactor method is used after OnDone.
class OriginService::ChunkStream final : public grpc::ServerWriteReactor<v1::ChunkMessage> {
 public:
  ChunkStream(OriginService* svc, grpc::CallbackServerContext* ctx, const v1::ReadChunksRequest* req)
      : svc_(svc), req_(*req), deadline_(DeadlineOf(*ctx, svc->options_.max_call_duration)) {}

  void Start(std::string client) {
    svc_->Spawn(std::move(client), [this] { Produce(); });
  }

  // Ends the call before any producer started (e.g. authentication failed).
  void Reject(const grpc::Status& s) {
    {
      MutexLock lock(&mu_);
      producer_done_ = finished_ = true;
      final_ = s;
    }
    Finish(s);
  }

  void OnWriteDone(bool ok) override {
    v1::ChunkMessage* next = nullptr;
    bool finish = false;
    {
      MutexLock lock(&mu_);
      if (!ok) {
        broken_ = true;
        DropQueueLocked();
      } else {
        svc_->ReleaseQueued(queue_.front()->ByteSizeLong());
        queue_.pop_front();
        if (!queue_.empty()) next = queue_.front().get();
      }
      writing_ = next != nullptr;
      if (!writing_ && producer_done_ && !finished_) finish = finished_ = true;
    }
    cv_.NotifyAll();
    if (next != nullptr) StartWrite(next);
    if (finish) DoFinish();
  }

  void OnCancel() override {
    {
      MutexLock lock(&mu_);
      broken_ = true;
      // The one being written (if any) stays until its OnWriteDone releases it.
      while (queue_.size() > (writing_ ? 1u : 0u)) {
        svc_->ReleaseQueued(queue_.back()->ByteSizeLong());
        queue_.pop_back();
      }
    }
    cv_.NotifyAll();
  }

  void OnDone() override {
    {
      MutexLock lock(&mu_);  // final_ no longer changes; taken for the analysis
      CountRequest("ReadChunks", final_);
    }
    delete this;
  }

 private:
  // Queues one message; waits while the queue is full, or while all streams together queue
  // max_queued_bytes and this one has a message queued already. False when the client is gone.
  bool Push(std::unique_ptr<v1::ChunkMessage> msg) {
    v1::ChunkMessage* start = nullptr;
    const uint64_t bytes = msg->ByteSizeLong();
    {
      MutexLock lock(&mu_);
      for (;;) {
        cv_.Wait(&mu_, [&]() REQUIRES(mu_) { return broken_ || queue_.size() < svc_->options_.queue_depth; });
        if (broken_) return false;
        if (svc_->ReserveQueued(bytes, queue_.empty())) break;
        // Other streams' writes free the shared budget; they do not wake this stream.
        cv_.WaitFor(&mu_, std::chrono::milliseconds(20));
      }
      queue_.push_back(std::move(msg));
      if (!writing_) {
        writing_ = true;
        start = queue_.front().get();
      }
    }
    if (start != nullptr) StartWrite(start);
    return true;
  }

  // A block range names blocks inside its one chunk.
  Status CheckBlockRange(const DatasetPtr& d) const {
    if (req_.block_count() == 0) {
      if (req_.first_block() != 0) return InvalidArgument("first_block without block_count");
      if (req_.more_ranges_size() > 0) return InvalidArgument("more_ranges after a request that is not a block range");
      return Status::Ok();
    }
    if (req_.chunk_count() != 1) {
      return InvalidArgument("a block range must name exactly one chunk (chunk_count " +
                             std::to_string(req_.chunk_count()) + ")");
    }
    if (req_.more_ranges_size() > kMaxMoreRanges) {
      return InvalidArgument(std::to_string(req_.more_ranges_size()) + " more_ranges in one request; at most " +
                             std::to_string(kMaxMoreRanges));
    }
    SC_RETURN_IF_ERROR(CheckBlocks(d, req_.shard(), req_.first_chunk(), req_.first_block(), req_.block_count()));
    for (const v1::BlockRange& r : req_.more_ranges()) {
      SC_RETURN_IF_ERROR(CheckChunkRange(d, r.shard(), r.chunk(), 1));
      if (r.block_count() == 0) return InvalidArgument("a block range of more_ranges has no blocks");
      SC_RETURN_IF_ERROR(CheckBlocks(d, r.shard(), r.chunk(), r.first_block(), r.block_count()));
    }
    return Status::Ok();
  }

  Status CheckBlocks(const DatasetPtr& d, uint32_t shard, uint64_t chunk, uint32_t first, uint32_t count) const {
    const uint64_t blocks = ChunkBlockCount(dataset::ChunkLength(d->manifest, shard, chunk));
    if (uint64_t{first} + count > blocks) {
      return InvalidArgument("blocks [" + std::to_string(first) + ", +" + std::to_string(count) +
                             ") lie outside chunk " + std::to_string(chunk) + " of shard " + std::to_string(shard) +
                             " of '" + req_.dataset() + "' (" + std::to_string(blocks) + " blocks)");
    }
    return Status::Ok();
  }

  // The request's block range, then each of more_ranges: one message each.
  Status SendBlockRanges(const DatasetPtr& d, const ReadOptions& ro, upstream::ChunkEncoder& encoder) {
    v1::BlockRange first;
    first.set_shard(req_.shard());
    first.set_chunk(req_.first_chunk());
    first.set_first_block(req_.first_block());
    first.set_block_count(req_.block_count());
    first.set_want_block_table(req_.want_block_table());
    SC_RETURN_IF_ERROR(SendBlocks(d, first, ro, encoder));
    for (const v1::BlockRange& r : req_.more_ranges()) SC_RETURN_IF_ERROR(SendBlocks(d, r, ro, encoder));
    return Status::Ok();
  }

  // One message: blocks of a chunk, with the chunk's block table if asked.
  Status SendBlocks(const DatasetPtr& d, const v1::BlockRange& b, const ReadOptions& ro,
                    upstream::ChunkEncoder& encoder) {
    SC_ASSIGN_OR_RETURN(BlockRange r, svc_->source_.ReadBlocks(d, b.shard(), b.chunk(), b.first_block(),
                                                               b.block_count(), b.want_block_table(), ro));
    auto msg = std::make_unique<v1::ChunkMessage>();
    msg->set_chunk(b.chunk());
    msg->set_hash(dataset::ChunkHash(d->manifest, b.shard(), b.chunk()).ToBytes());
    msg->set_first_block(b.first_block());
    *msg->mutable_block_table() = std::move(r.table);
    encoder.Encode(r.bytes->bytes.data() + r.offset, r.size, req_.accept_zstd(), msg.get());
    CountBytes(r.size, msg->payload().size() + msg->block_table().size());
    if (!Push(std::move(msg))) return Cancelled("client went away");
    return Status::Ok();
  }

  // One chunk: one message, or parts of part_blocks blocks in order when the reader asks.
  Status SendChunk(uint64_t index, const Chunk& chunk, upstream::ChunkEncoder& encoder) {
    const uint64_t size = chunk.bytes.size();
    const uint64_t part = req_.part_blocks() > 0 ? uint64_t{req_.part_blocks()} * kChunkBlockBytes : size;
    uint64_t at = 0;
    do {
      const uint64_t n = std::min(part, size - at);
      auto msg = std::make_unique<v1::ChunkMessage>();
      msg->set_chunk(index);
      msg->set_hash(chunk.hash.ToBytes());
      msg->set_first_block(static_cast<uint32_t>(at / kChunkBlockBytes));
      encoder.Encode(chunk.bytes.data() + at, n, req_.accept_zstd(), msg.get());
      CountBytes(n, msg->payload().size());
      if (!Push(std::move(msg))) return Cancelled("client went away");
      at += n;
    } while (at < size);
    return Status::Ok();
  }

  void Produce() {
    Status st = [&]() -> Status {
      SC_ASSIGN_OR_RETURN(DatasetPtr d, svc_->OpenVersion(req_.dataset(), req_.version()));
      SC_RETURN_IF_ERROR(CheckChunkRange(d, req_.shard(), req_.first_chunk(), req_.chunk_count()));
      SC_RETURN_IF_ERROR(CheckBlockRange(d));
      ReadOptions ro;
      ro.deadline = deadline_;
      ro.priority = req_.priority() == v1::PREFETCH ? FetchPriority::kPrefetch : FetchPriority::kDemand;
      ro.via_peers = !req_.from_peer();
      upstream::ChunkEncoder encoder(svc_->options_.encoder);
      if (req_.block_count() > 0) return SendBlockRanges(d, ro, encoder);
      return svc_->source_.ReadChunks(d, req_.shard(), req_.first_chunk(), req_.chunk_count(), ro,
                                      [&](uint64_t index, const ChunkPtr& chunk) { return SendChunk(index, *chunk, encoder); });
    }();
    if (!st.ok() && st.code() != StatusCode::kCancelled) {
      SC_LOG_RATE_LIMITED(spdlog::level::info, "ReadChunks '{}' shard {} [{}, +{}): {}", req_.dataset(),
                          req_.shard(), req_.first_chunk(), req_.chunk_count(), st.ToString());
    }
    bool finish = false;
    {
      MutexLock lock(&mu_);
      producer_done_ = true;
      final_ = ToGrpcStatus(st);
      if (!writing_ && !finished_) finish = finished_ = true;
    }
    if (finish) DoFinish();
  }

  // Forgets every queued message (the client is gone).
  void DropQueueLocked() REQUIRES(mu_) {
    for (const auto& m : queue_) svc_->ReleaseQueued(m->ByteSizeLong());
    queue_.clear();
  }

  void DoFinish() {
    grpc::Status s;
    {
      MutexLock lock(&mu_);
      s = final_;
    }
    Finish(s);
  }

  OriginService* const svc_;
  const v1::ReadChunksRequest req_;
  const Clock::time_point deadline_;
  Mutex mu_;
  CondVar cv_;
  std::deque<std::unique_ptr<v1::ChunkMessage>> queue_ GUARDED_BY(mu_);  // front is being written
  bool writing_ GUARDED_BY(mu_) = false;
  bool broken_ GUARDED_BY(mu_) = false;  // cancelled / write failed
  bool producer_done_ GUARDED_BY(mu_) = false;
  bool finished_ GUARDED_BY(mu_) = false;
  grpc::Status final_ GUARDED_BY(mu_);  // until finished_
};

grpc::ServerWriteReactor<v1::ChunkMessage>* OriginService::ReadChunks(grpc::CallbackServerContext* ctx,
                                                                      const v1::ReadChunksRequest* req) {
  auto* stream = new ChunkStream(this, ctx, req);
  std::string client;
  if (grpc::Status a = Admit(*ctx, &client); !a.ok()) {
    // No producer: finish at once. OnDone counts the request and deletes the stream.
    stream->Reject(a);
    return stream;
  }
  stream->Start(std::move(client));
  return stream;
}

grpc::ServerUnaryReactor* OriginService::CheckpointCall(const char* method, grpc::CallbackServerContext* ctx,
                                                        const std::string& name, std::function<Status()> work) {
  auto* reactor = ctx->DefaultReactor();
  std::string client;
  grpc::Status s = ToGrpcStatus(store_.Authorize(BearerToken(*ctx), name));
  if (s.ok()) s = TakePlace(*ctx, &client);
  if (!s.ok()) {
    CountRequest(method, s);
    reactor->Finish(s);
    return reactor;
  }
  // Disk writes, fsyncs and whole-object reads: never on gRPC's threads.
  Spawn(std::move(client), [reactor, method, work = std::move(work)] {
    const Status st = work();
    if (!st.ok() && st.code() != StatusCode::kNotFound) {
      SC_LOG_RATE_LIMITED(spdlog::level::info, "{}: {}", method, st.ToString());
    }
    grpc::Status s = ToGrpcStatus(st);
    CountRequest(method, s);
    reactor->Finish(s);
  });
  return reactor;
}

grpc::ServerUnaryReactor* OriginService::BeginUpload(grpc::CallbackServerContext* ctx, const v1::UploadHeader* req,
                                                     v1::UploadState* resp) {
  return CheckpointCall("BeginUpload", ctx, req->name(), [this, req, resp] {
    return Deliver(store_.BeginUpload(*req), resp);
  });
}

grpc::ServerUnaryReactor* OriginService::PutPart(grpc::CallbackServerContext* ctx, const v1::PutPartRequest* req,
                                                 v1::UploadState* resp) {
  return CheckpointCall("PutPart", ctx, req->name(), [this, req, resp] { return Deliver(store_.PutPart(*req), resp); });
}

grpc::ServerUnaryReactor* OriginService::CommitUpload(grpc::CallbackServerContext* ctx,
                                                      const v1::CommitUploadRequest* req, v1::UploadState* resp) {
  return CheckpointCall("CommitUpload", ctx, req->name(), [this, req, resp] {
    return Deliver(store_.CommitUpload(*req), resp);
  });
}

grpc::ServerUnaryReactor* OriginService::StatObject(grpc::CallbackServerContext* ctx,
                                                    const v1::StatObjectRequest* req, v1::ObjectInfo* resp) {
  return CheckpointCall("StatObject", ctx, req->name(), [this, req, resp] {
    return Deliver(store_.StatObject(*req), resp);
  });
}

grpc::ServerUnaryReactor* OriginService::ReadPart(grpc::CallbackServerContext* ctx, const v1::ReadPartRequest* req,
                                                  v1::ObjectPart* resp) {
  return CheckpointCall("ReadPart", ctx, req->name(), [this, req, resp] { return Deliver(store_.ReadPart(*req), resp); });
}

Result<std::unique_ptr<OriginServer>> StartOriginServer(ChunkSource& source, const ServerOptions& options,
                                                        OriginServiceOptions service_options) {
  auto out = std::make_unique<OriginServer>();
  service_options.token = options.token;
  out->service = std::make_unique<OriginService>(source, std::move(service_options));
  SC_ASSIGN_OR_RETURN(out->server, GrpcServer::Start(options, {out->service.get()}));
  return out;
}

}  // namespace shardcache::serve
