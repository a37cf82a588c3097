#include "daemon/upstream/grpc_source.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <random>

#include <spdlog/spdlog.h>

#include "common/host_port.h"
#include "common/log.h"
#include "common/metrics.h"
#include "common/thread_name.h"
#include "daemon/upstream/chunk_codec.h"
#include "daemon/upstream/upstream_uri.h"
#include "shardcache/origin.grpc.pb.h"

namespace shardcache::upstream {
namespace {

using Clock = std::chrono::steady_clock;

// The counters GrpcSource keeps (its stats()) and reports through VisitStats; the Registry
// sums the live sources into one series per family.
using stats::Family;
constexpr Family kWireBytes{"shardcache_upstream_wire_bytes_total",
                            "Chunk payload bytes received from the upstream as sent (after zstd)"};
constexpr Family kPayloadBytes{"shardcache_upstream_payload_bytes_total",
                               "Verified bytes fetched from the upstream after decoding (chunks, block ranges and "
                               "their block tables)"};
constexpr Family kChunks{"shardcache_upstream_chunks_total", "Chunks fetched and verified"};
constexpr Family kBlockRanges{"shardcache_upstream_block_ranges_total",
                              "Block ranges of chunks fetched and verified (sub-chunk reads)"};
constexpr Family kBlockTables{"shardcache_upstream_block_tables_total",
                              "Chunk block tables received with block ranges (each 16 bytes per 16 KiB block)"};
constexpr Family kStreams{"shardcache_upstream_streams_total", "ReadChunks streams opened upstream"};
constexpr Family kRetries{"shardcache_upstream_retries_total", "Upstream attempts after a failure"};
constexpr Family kHedges{"shardcache_upstream_hedges_total",
                         "Stuck demand fetches re-issued on another stream (the first verified copy wins)"};
constexpr Family kRangeHedges{"shardcache_upstream_range_hedges_total",
                              "Of the hedges, those of block ranges (the others re-issue whole chunks)"};
constexpr Family kStalledConnections{"shardcache_upstream_stalled_connections_total",
                                     "Connections closed after a stream on them was found stuck (not given to the next fetch)"};
constexpr Family kStripedRanges{"shardcache_upstream_striped_ranges_total",
                                 "Block ranges of a batch's read cut into stripes over idle streams"};
constexpr Family kChecksumFailures{"shardcache_upstream_checksum_failures_total",
                                   "Fetched chunks that failed decoding or hash verification (refetched)"};

// gRPC deadlines are system_clock; ours are steady_clock.
std::chrono::system_clock::time_point ToSystem(Clock::time_point t) {
  return std::chrono::system_clock::now() +
         std::chrono::duration_cast<std::chrono::system_clock::duration>(t - Clock::now());
}

Result<std::string> ReadPem(const std::string& value, const char* what) {
  if (value.empty() || value.rfind("-----BEGIN", 0) == 0) return value;
  auto r = ReadFileToString(value);
  if (!r.ok()) return r.status().WithContext(std::string("reading ") + what);
  return r;
}

std::chrono::milliseconds Jittered(std::chrono::milliseconds base) {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  std::uniform_real_distribution<double> d(0.5, 1.5);
  return std::chrono::milliseconds(static_cast<int64_t>(static_cast<double>(base.count()) * d(rng)));
}

}  // namespace

Status FromGrpcStatus(const grpc::Status& s) {
  if (s.ok()) return Status::Ok();
  return Status(static_cast<StatusCode>(s.error_code()), s.error_message());
}

bool Retryable(StatusCode c) {
  switch (c) {
    case StatusCode::kUnavailable:
    case StatusCode::kDeadlineExceeded:
    case StatusCode::kResourceExhausted:
    case StatusCode::kAborted:
    case StatusCode::kInternal:
    case StatusCode::kUnknown:
    case StatusCode::kCancelled:
      return true;
    default:
      return false;
  }
}

// What no GrpcSource keeps: the gauges of the fetch scheduler.
struct UpstreamGauges {
  metrics::Gauge* in_flight;
  metrics::Gauge* stream_limit;
  metrics::Gauge* goodput;
  metrics::Gauge* workers;
  metrics::Gauge* in_flight_bytes;
  metrics::Gauge* stuck;
};

namespace {
const UpstreamGauges& M() {
  static const UpstreamGauges m = [] {
    auto& r = metrics::Registry::Global();
    return UpstreamGauges{
        r.GetGauge("shardcache_upstream_fetches_in_flight", "Upstream streams running now"),
        r.GetGauge("shardcache_upstream_stream_limit", "Adaptive limit of concurrent streams"),
        r.GetGauge("shardcache_upstream_goodput_bytes_per_second",
                   "Bytes per second received from the upstream (as the link carries them) in the last measuring period"),
        r.GetGauge("shardcache_upstream_workers", "Upstream fetch threads alive (one per busy or recently used slot)"),
        r.GetGauge("shardcache_upstream_in_flight_bytes",
                   "Chunk bytes requested from the upstream and not yet handed to their readers"),
        r.GetGauge("shardcache_upstream_stuck_streams",
                   "Upstream streams with no message for longer than their kind usually takes (stalled connections); "
                   "they do not count against the stream limit"),
    };
  }();
  return m;
}

// The same gauges for a source that reports nothing (GrpcSourceOptions::report_metrics false).
const UpstreamGauges& Unreported() {
  static metrics::Gauge g[6];
  static const UpstreamGauges m{&g[0], &g[1], &g[2], &g[3], &g[4], &g[5]};
  return m;
}

}  // namespace

struct GrpcSource::Connection {
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::Origin::Stub> stub;
};

// The bytes of the whole chunk a task is receiving in parts, shared with its hedge: a striped
// hedge of a stream stalled mid-chunk fetches only the blocks after `filled` and takes the rest
// from here (RunStriped).
struct PartialChunk {
  Mutex mu;
  uint64_t chunk GUARDED_BY(mu) = UINT64_MAX;  // UINT64_MAX: none
  AlignedBuffer bytes GUARDED_BY(mu);
  uint64_t filled GUARDED_BY(mu) = 0;  // bytes [0, filled) arrived
};

struct GrpcSource::FetchTask {
  DatasetPtr dataset;
  uint32_t shard = 0;
  uint64_t first = 0, end = 0;
  FetchPriority priority = FetchPriority::kDemand;
  Clock::time_point deadline;
  // Leaders of chunks [first, end), shared with a hedge (whose own is the original's).
  std::shared_ptr<ChunkLeaders> leaders = std::make_shared<ChunkLeaders>();
  // A block range (block_count > 0): blocks [first_block, first_block + block_count) of chunk
  // `first` (end == first + 1); its one flight publishes the range's bytes.
  uint32_t first_block = 0, block_count = 0;

  // Hedging. A hedge races `original` for the same leaders and never publishes a failure (the
  // original still may succeed). Under GrpcSource::mu_: `hedges`, those HedgeLoop made (a
  // second only once the first is stuck as well; at most kMaxHedges).
  bool is_hedge = false;
  bool striped = false;  // a hedge run as block ranges on other streams (RunStriped)
  std::weak_ptr<FetchTask> original;
  std::vector<std::shared_ptr<FetchTask>> hedges;
  // Steady-clock ns of the running attempt's start or its last message (0: not running).
  std::atomic<int64_t> last_heard_ns{0};
  // HedgeLoop found this task's stream stuck: its connection is closed once the task ends, not
  // given to the next task (a stalled TCP connection stays stalled after the call is cancelled;
  // traced: a range and its three hedges all stuck on slots freed by cancelled stuck batches).
  std::atomic<bool> stalled{false};
  // The running attempt had a message (its stream answered at all).
  std::atomic<bool> answered{false};
  PartialChunk partial;  // a whole chunk arriving in parts
  // Batching (RunBatch). `alone`: a range that did not arrive on a batch's stream runs alone
  // from then on. `companions`: the ranges riding on this task's stream, for HedgeLoop; under
  // GrpcSource::mu_.
  bool alone = false;
  std::vector<std::shared_ptr<FetchTask>> companions;

  // Cancellation by the caller that gave up, or by shutdown: stops between messages and
  // interrupts a blocking Read through the active context.
  std::atomic<bool> cancelled{false};
  Mutex ctx_mu;
  grpc::ClientContext* ctx GUARDED_BY(ctx_mu) = nullptr;
  void Cancel() {
    cancelled.store(true);
    CancelAttempt();
  }
  // Ends the running attempt only (the task then decides whether to retry).
  void CancelAttempt() {
    MutexLock lock(&ctx_mu);
    if (ctx != nullptr) ctx->TryCancel();
  }
};

namespace {

// A target written as a URI ("grpc://h:p", "grpcs://h:p") becomes "h:p" with `tls` set from
// its scheme; a bare "host:port" keeps `tls` as given.
Status ResolveTarget(GrpcSourceOptions* options) {
  if (options->target.find("://") == std::string::npos) {
    return CheckHostPort(options->target).WithContext("upstream");
  }
  SC_ASSIGN_OR_RETURN(UpstreamUri uri, ParseUpstreamUri(options->target));
  if (uri.scheme == UpstreamUri::Scheme::kFile || uri.scheme == UpstreamUri::Scheme::kObject) {
    return InvalidArgument("upstream '" + options->target + "' is not grpc://HOST:PORT or grpcs://HOST:PORT");
  }
  options->target = uri.target;
  options->tls = uri.tls();
  return Status::Ok();
}

}  // namespace

GrpcSource::GrpcSource(GrpcSourceOptions options)
    : options_(std::move(options)),
      bucket_(options_.bandwidth_bytes_per_s),
      controller_([&] {
        StreamControllerOptions c = options_.controller;
        c.max = std::max(1, options_.max_connections);
        c.initial = std::clamp(options_.connections, 1, c.max);
        return c;
      }()),
      health_(Where(), options_.outage_timeout, options_.report_metrics),
      m_(options_.report_metrics ? M() : Unreported()) {}

Result<std::unique_ptr<GrpcSource>> GrpcSource::Create(GrpcSourceOptions options) {
  SC_RETURN_IF_ERROR(ResolveTarget(&options));
  if (options.connections < 1 || options.max_connections < 1) {
    return InvalidArgument("fetch.connections and fetch.max_connections must be >= 1");
  }
  if (options.chunks_per_stream < 1) return InvalidArgument("chunks_per_stream must be >= 1");
  if (options.max_retries < 0) return InvalidArgument("max_retries must be >= 0");
  if (options.cert.empty() != options.key.empty()) {
    return InvalidArgument("a client certificate needs both cert and key");
  }
  if (!options.tls && (!options.ca.empty() || !options.cert.empty())) {
    return InvalidArgument("upstream " + options.target +
                           " is plain grpc://; CA or client certificate given — use grpcs://");
  }
  std::shared_ptr<grpc::ChannelCredentials> creds;
  if (options.tls) {
    grpc::SslCredentialsOptions ssl;
    SC_ASSIGN_OR_RETURN(ssl.pem_root_certs, ReadPem(options.ca, "tls ca"));
    SC_ASSIGN_OR_RETURN(ssl.pem_cert_chain, ReadPem(options.cert, "tls cert"));
    SC_ASSIGN_OR_RETURN(ssl.pem_private_key, ReadPem(options.key, "tls key"));
    creds = grpc::SslCredentials(ssl);
  } else {
    creds = grpc::InsecureChannelCredentials();
  }
  if (options.max_connections > kMaxMaxConnections) {
    return InvalidArgument("fetch.max_connections must be at most " + std::to_string(kMaxMaxConnections));
  }
  if (options.max_in_flight_bytes == 0) return InvalidArgument("fetch.max_in_flight must be > 0");
  std::unique_ptr<GrpcSource> src(new GrpcSource(options));
  src->creds_ = std::move(creds);
  src->control_ = std::make_unique<Connection>();
  src->control_->channel = src->NewChannel(-2);
  src->control_->stub = v1::Origin::NewStub(src->control_->channel);
  {
    MutexLock lock(&src->mu_);  // not shared yet; taken for the analysis
    const auto n = static_cast<size_t>(options.max_connections);
    src->connections_.resize(n);
    src->slot_busy_.assign(n, false);
    src->running_conn_.assign(n, nullptr);
    src->slot_used_.assign(n, Clock::time_point());
  }
  src->prober_ = std::thread([s = src.get()] {
    NameThisThread("sc-up-probe");
    s->ProbeLoop();
  });
  src->hedger_ = std::thread([s = src.get()] {
    NameThisThread("sc-up-hedge");
    s->HedgeLoop();
  });
  src->m_.stream_limit->Set(src->controller_.limit());
  if (src->options_.report_metrics) src->stats_source_ = metrics::Registry::Global().AddSource(src.get());
  return src;
}

GrpcSource::~GrpcSource() {
  stats_source_.Reset();  // its last counts stay in the Registry's series
  Shutdown();
  std::map<uint64_t, std::thread> workers;
  {
    MutexLock lock(&mu_);  // stopping_: no worker starts after this
    workers.swap(workers_);
  }
  for (auto& [id, w] : workers) w.join();
  if (prober_.joinable()) prober_.join();
  if (hedger_.joinable()) hedger_.join();
}

void GrpcSource::Shutdown() {
  std::deque<std::shared_ptr<FetchTask>> dropped;
  {
    MutexLock lock(&mu_);
    stopping_ = true;
    for (const std::shared_ptr<FetchTask>& t : running_conn_) {
      if (t != nullptr) t->Cancel();
    }
    for (grpc::ClientContext* ctx : unary_) ctx->TryCancel();
    if (probe_ctx_ != nullptr) probe_ctx_->TryCancel();  // shutdown does not wait out a probe
    dropped.swap(demand_);
    for (auto& t : prefetch_) dropped.push_back(std::move(t));
    prefetch_.clear();
  }
  cv_.NotifyAll();
  work_cv_.NotifyAll();
  probe_cv_.NotifyAll();
  // Leaders that never ran publish Aborted to their waiters.
  for (auto& t : dropped) t->leaders->Drop();
}

std::shared_ptr<grpc::Channel> GrpcSource::NewChannel(int index) const {
  grpc::ChannelArguments args;
  // Separate TCP connections: without these, channels with equal arguments share one
  // subchannel and so one socket (grpc/grpc#21332).
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  args.SetInt("shardcache.connection_index", index);
  args.SetMaxReceiveMessageSize(64 << 20);
  args.SetMaxSendMessageSize(64 << 20);
  // Receive windows sized by BDP probing, from a 64 MiB lookahead. Without probing this gRPC
  // announces about one message of window per stream, so the sender waits a round trip per
  // message: measured on bench cold (150 ms / 1 Gbit / 4 MiB window, 64 KiB block ranges in
  // batches) every 1 MiB batch took 2.6 s, one message per round trip, and the link ran at
  // 0.65; with probing 0.93 (and 0.97 at 30 ms). A big frame size cuts framing overhead.
  args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 1);
  args.SetInt(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 64 << 20);
  args.SetInt(GRPC_ARG_HTTP2_MAX_FRAME_SIZE, 1 << 20);
  // Reconnect quickly after a reset; our own retries pace the attempts.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  // Despite its name, gRPC core uses this as the least time a connection attempt gets
  // (MIN_CONNECT_TIMEOUT of doc/connection-backoff.md). At 100 ms, every connection made to an
  // upstream 150 ms away failed "before receiving SETTINGS frame" (TCP and HTTP/2 handshakes
  // take a round trip or two) and the stream pool could not grow on long links.
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 10000);
  // Notice a silently dead connection (blackhole) well before call_timeout.
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 10000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 5000);
  args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  // Resuming a broken stream is ours to do (gRFC A6 stops after headers anyway).
  args.SetInt(GRPC_ARG_ENABLE_RETRIES, 0);
  return grpc::CreateCustomChannel(options_.target, creds_, args);
}

std::string GrpcSource::Where() const { return "upstream " + options_.target; }

std::shared_ptr<grpc::Channel> GrpcSource::NewCallChannel(int index) const {
  return NewChannel(1000 + index);  // apart from the chunk slots' indexes
}

void GrpcSource::AddAuth(grpc::ClientContext* ctx) const {
  if (!options_.token.empty()) ctx->AddMetadata("authorization", "Bearer " + options_.token);
}

bool GrpcSource::SleepUntil(Clock::time_point t) {
  MutexLock lock(&mu_);
  return !cv_.WaitUntil(&mu_, t, [&]() REQUIRES(mu_) { return stopping_; });
}

void GrpcSource::ProbeLoop() {
  // A probe within a third of the outage bound, so that a silent upstream is declared down
  // well before reads give up on it.
  const auto interval = std::min<std::chrono::milliseconds>(options_.probe_interval, options_.outage_timeout / 3);
  // A channel of its own, made afresh after each failed probe: one that failed carries gRPC's
  // reconnect backoff and answers "unavailable" for seconds after the upstream is back.
  std::unique_ptr<v1::Origin::Stub> probe;
  MutexLock lock(&mu_);
  while (!stopping_) {
    if (auto idle = TakeIdleConnections(Clock::now()); !idle.empty()) {
      lock.Unlock();
      spdlog::debug("{}: closed {} idle connections", Where(), idle.size());
      idle.clear();
      lock.Lock();
      continue;
    }
    // Attempts still waiting on an upstream that has been silent for the whole bound (a
    // blackholed stream notices nothing by itself until keepalive) are ended; their tasks
    // then fail with the outage error.
    if (Clock::now() >= health_.GiveUpAt()) {
      for (const std::shared_ptr<FetchTask>& t : running_conn_) {
        if (t != nullptr) t->CancelAttempt();
      }
    }
    // Every `interval` while it answers, every second while it does not, at once after a
    // failure (OnFailure's caller notifies).
    const auto quiet = health_.up() ? interval : std::min<std::chrono::milliseconds>(interval, std::chrono::seconds(1));
    if (!health_.ProbeDue(quiet)) {
      probe_cv_.WaitFor(&mu_, std::min<std::chrono::milliseconds>(quiet, std::chrono::seconds(1)));
      continue;
    }
    // The empty name is refused by the upstream's name check before anything is read.
    const auto started = Clock::now();
    grpc::ClientContext ctx;
    ctx.set_deadline(ToSystem(started + interval));
    AddAuth(&ctx);
    probe_ctx_ = &ctx;
    lock.Unlock();
    v1::GetManifestRequest req;
    v1::GetManifestResponse resp;
    if (!probe) probe = v1::Origin::NewStub(NewChannel(-1));
    const bool was_up = health_.up();
    const Status answer = FromGrpcStatus(probe->GetManifest(&ctx, req, &resp));
    spdlog::debug("{}: probe answered in {:.3f} s: {}", Where(),
                  std::chrono::duration<double>(Clock::now() - started).count(), answer.ToString());
    if (!ProbeAnswered(answer)) probe.reset();
    lock.Lock();
    if (ProbeAnswered(answer) && !was_up) {
      // Back: the data connections retry at once instead of waiting out their backoff.
      grpc::experimental::ChannelResetConnectionBackoff(control_->channel.get());
      for (auto& c : connections_) {
        if (c != nullptr) grpc::experimental::ChannelResetConnectionBackoff(c->channel.get());
      }
    }
    probe_ctx_ = nullptr;
    if (stopping_) break;
    health_.OnProbe(answer, started);
    // At most one probe a second, whatever wakes the loop.
    probe_cv_.WaitUntil(&mu_, started + std::chrono::seconds(1), [&]() REQUIRES(mu_) { return stopping_; });
  }
}

template <typename Call>
Status GrpcSource::UnaryWithRetries(const std::string& what, Call&& call) {
  const auto deadline = Clock::now() + options_.call_timeout;
  Status last;
  for (int attempt = 0;; ++attempt) {
    const auto started = Clock::now();
    if (started >= health_.GiveUpAt()) return health_.OutageError().WithContext(what);
    grpc::ClientContext ctx;
    // An attempt longer than the outage bound would outlast the outage it is part of.
    ctx.set_deadline(ToSystem(std::min({deadline, started + options_.outage_timeout, health_.GiveUpAt()})));
    AddAuth(&ctx);
    {
      MutexLock lock(&mu_);
      if (stopping_) return Cancelled(Where() + ": " + what + ": shardcached is stopping");
      unary_.insert(&ctx);  // Shutdown() cancels it
    }
    last = FromGrpcStatus(call(*control_->stub, &ctx));
    {
      MutexLock lock(&mu_);
      unary_.erase(&ctx);
    }
    if (last.ok() || !Retryable(last.code())) {
      if (ProbeAnswered(last)) health_.OnAnswer();
      break;
    }
    const bool give_up = health_.OnFailure(last, started);
    probe_cv_.NotifyAll();
    if (give_up) return health_.OutageError().WithContext(what);
    if (attempt >= options_.max_retries || Clock::now() >= deadline) break;
    retries_.fetch_add(1);
    const auto backoff = std::min(options_.backoff_max, options_.backoff_initial * (1 << std::min(attempt, 10)));
    if (!SleepUntil(std::min({deadline, Clock::now() + Jittered(backoff), health_.GiveUpAt()}))) break;
  }
  if (last.ok()) return last;
  if (last.code() == StatusCode::kDeadlineExceeded) {
    return Unavailable(Where() + ": " + what + ": no answer within " +
                       std::to_string(options_.call_timeout.count()) + " ms (" + last.message() + ")");
  }
  return last.WithContext(Where() + ": " + what);
}

Result<std::vector<v1::DatasetSummary>> GrpcSource::ListDatasets() {
  v1::ListDatasetsResponse resp;
  SC_RETURN_IF_ERROR(UnaryWithRetries("ListDatasets", [&](v1::Origin::Stub& stub, grpc::ClientContext* ctx) {
    resp.Clear();
    return stub.ListDatasets(ctx, v1::ListDatasetsRequest(), &resp);
  }));
  return std::vector<v1::DatasetSummary>(resp.datasets().begin(), resp.datasets().end());
}

Result<DatasetPtr> GrpcSource::OpenDataset(const std::string& name) {
  SC_RETURN_IF_ERROR(CheckDatasetName(name));
  auto cached = [&](DatasetPtr* stale) -> DatasetPtr {
    MutexLock lock(&manifest_mu_);
    auto it = manifests_.find(name);
    if (it == manifests_.end()) return nullptr;
    if (Clock::now() - it->second.fetched < options_.manifest_ttl) return it->second.dataset;
    *stale = it->second.dataset;
    return nullptr;
  };
  DatasetPtr stale;
  if (DatasetPtr fresh = cached(&stale)) return fresh;
  // One GetManifest per name at a time: the loaders of a job opening together cost one round
  // trip, not one each.
  auto flight = manifest_flights_.Join(name);
  if (!flight.leader()) {
    auto shared = flight.Wait(Clock::now() + options_.call_timeout + std::chrono::seconds(1));
    if (shared) return *shared;
    if (stale) return stale;
    return Unavailable(Where() + ": GetManifest '" + name + "': no answer within " +
                       std::to_string(options_.call_timeout.count()) + " ms");
  }
  // A flight that ended between our look at the cache and Join may have refreshed it.
  DatasetPtr again = cached(&stale);
  // Reads follow an open: the stream pool connects while the manifest travels, so the first
  // batch's ranges find their connections ready instead of paying a handshake round trip.
  if (!again) PreConnect();
  Result<DatasetPtr> result = again ? Result<DatasetPtr>(again) : FetchManifest(name, stale);
  flight.Publish(result);
  return result;
}

Result<DatasetPtr> GrpcSource::FetchManifest(const std::string& name, const DatasetPtr& stale) {
  v1::GetManifestRequest req;
  req.set_dataset(name);
  v1::GetManifestResponse resp;
  Status s = UnaryWithRetries("GetManifest '" + name + "'", [&](v1::Origin::Stub& stub, grpc::ClientContext* ctx) {
    resp.Clear();
    return stub.GetManifest(ctx, req, &resp);
  });
  if (!s.ok()) {
    if (stale && Retryable(s.code())) {
      // The outage itself is logged once by health_.
      spdlog::debug("{}; serving the last known manifest of '{}' ({})", s.ToString(), name, stale->version);
      return stale;
    }
    return s;
  }
  const std::string where = Where() + " manifest of '" + name + "'";
  if (dataset::ManifestVersion(resp.manifest()) != resp.version()) {
    return DataLoss(where + ": version " + resp.version() +
                    " does not match the hash of the manifest bytes received (" +
                    dataset::ManifestVersion(resp.manifest()) + ")");
  }
  SC_ASSIGN_OR_RETURN(DatasetPtr d, dataset::MakeDataset(std::move(*resp.mutable_manifest()), where, name));
  MutexLock lock(&manifest_mu_);
  auto& slot = manifests_[name];
  // Reuse the previous object when nothing changed, so callers comparing pointers stay happy.
  if (slot.dataset && slot.dataset->version == d->version) d = slot.dataset;
  slot = CachedManifest{d, Clock::now()};
  return d;
}

Result<std::string> GrpcSource::GetSampleIndex(const DatasetPtr& d, uint32_t shard) {
  if (shard >= static_cast<uint32_t>(d->manifest.shards_size())) {
    return InvalidArgument("dataset '" + d->name + "' has " + std::to_string(d->manifest.shards_size()) +
                           " shards; shard " + std::to_string(shard) + " does not exist");
  }
  v1::GetSampleIndexRequest req;
  req.set_dataset(d->name);
  req.set_version(d->version);
  req.set_shard(shard);
  v1::GetSampleIndexResponse resp;
  SC_RETURN_IF_ERROR(UnaryWithRetries("GetSampleIndex '" + d->name + "' shard " + std::to_string(shard),
                                      [&](v1::Origin::Stub& stub, grpc::ClientContext* ctx) {
                                        resp.Clear();
                                        return stub.GetSampleIndex(ctx, req, &resp);
                                      }));
  auto parsed = dataset::ParseSampleIndex(resp.sample_index(), d->manifest, shard,
                                          Where() + " dataset '" + d->name + "'");
  if (!parsed.ok()) return parsed.status();
  return std::move(*resp.mutable_sample_index());
}

void GrpcSource::Submit(std::shared_ptr<FetchTask> task) {
  bool demand = false;
  {
    MutexLock lock(&mu_);
    if (stopping_) {
      task->leaders->Drop();  // no worker will run it: its waiters get Aborted now
      return;
    }
    if (running_ >= StreamLimit()) waited_.store(true);
    demand = task->priority == FetchPriority::kDemand;
    (demand ? demand_ : prefetch_).push_back(std::move(task));
    SpawnWorkers();
  }
  if (demand) cv_.NotifyAll();  // the hedger idles while no stream runs and no demand waits
  work_cv_.NotifyOne();
}

void GrpcSource::Expedite(const ChunkKey& key) {
  flights_.MarkWanted(key);
  PromoteToDemand([&](const FetchTask& t) {
    return t.block_count == 0 && t.shard == key.shard && key.chunk >= t.first && key.chunk < t.end &&
           VersionId(t.dataset->version) == key.version;
  });
}

void GrpcSource::ExpediteRange(const DatasetPtr& d, uint32_t shard, uint64_t chunk, uint32_t first_block,
                               uint32_t block_count) {
  PromoteToDemand([&](const FetchTask& t) {
    return t.block_count == block_count && t.first_block == first_block && t.first == chunk && t.shard == shard &&
           !t.is_hedge && t.dataset->version == d->version;
  });
}

void GrpcSource::PromoteToDemand(const std::function<bool(const FetchTask&)>& match) {
  MutexLock lock(&mu_);
  auto it = std::find_if(prefetch_.begin(), prefetch_.end(), [&](const auto& t) { return match(*t); });
  if (it == prefetch_.end()) return;
  demand_.push_back(std::move(*it));
  prefetch_.erase(it);
  SpawnWorkers();
  cv_.NotifyAll();
  work_cv_.NotifyOne();
}

int GrpcSource::DemandLimit() const {
  return std::min<int>(controller_.limit() + stuck_ + kDemandLanes, static_cast<int>(slot_busy_.size()));
}

int GrpcSource::StreamLimit() const {
  return std::min<int>(controller_.limit() + stuck_, static_cast<int>(slot_busy_.size()));
}

std::chrono::nanoseconds GrpcSource::StuckAfter(bool range, int64_t usual) {
  const std::chrono::nanoseconds floor = range ? std::chrono::milliseconds(200) : std::chrono::milliseconds(500);
  if (usual == 0) {
    // Before any message of its kind arrived. A block range is a round trip: 5x the floor. A
    // whole chunk's time depends on the link and how many share it, unknown yet: on a cold start
    // every stream opens at once and the first chunks are slow by nature, not stuck, so a hedge
    // would only send them twice. None until one chunk has shown the usual time.
    return range ? 5 * floor : std::chrono::nanoseconds::max();
  }
  return std::max(floor, std::chrono::nanoseconds(4 * usual));
}

void GrpcSource::HedgeLoop() {
  MutexLock lock(&mu_);
  while (!stopping_) {
    // Idle until work runs; then a look every 50 ms.
    cv_.Wait(&mu_, [&]() REQUIRES(mu_) { return stopping_ || running_ > 0 || !demand_.empty(); });
    if (stopping_) break;
    cv_.WaitFor(&mu_, std::chrono::milliseconds(50), [&]() REQUIRES(mu_) { return stopping_; });
    const int64_t now = Clock::now().time_since_epoch().count();
    // The usual times once per look, not per running task (each is a median over 255 messages).
    const int64_t usual_part = chunk_times_.Median(), usual_range = range_times_.Median();
    const std::chrono::nanoseconds stuck_part = StuckAfter(false, usual_part), stuck_range = StuckAfter(true, usual_range);
    // An attempt not answered yet waits a round trip and the link's queue (half a second behind
    // 128 streams' windows, traced), not one message's time: 4x the usual first answer at least.
    const int64_t usual_first = first_times_.Median();
    const auto stuck_after = [&](const FetchTask& f, std::chrono::nanoseconds stuck) {
      return f.answered.load() || usual_first == 0 ? stuck : std::max(stuck, std::chrono::nanoseconds(4 * usual_first));
    };
    // Streams to spare (nothing queued, at most half the limit running: the link mostly idles):
    // a stuck prefetch is rescued before a read waits for it. At an epoch's tail the reads to
    // come sit in stalled prefetch batches while the link idles (traced: 3-4 s of a 13 s cold
    // epoch at 1% stalls).
    const bool spare = demand_.empty() && prefetch_.empty() && 2 * running_ <= controller_.limit();
    const auto is_stuck = [&](const FetchTask& f) {
      const int64_t heard = f.last_heard_ns.load();
      return heard != 0 && !f.cancelled.load() &&
             std::chrono::nanoseconds(now - heard) >= stuck_after(f, f.block_count > 0 ? stuck_range : stuck_part);
    };
    // A stalled connection carries nothing: its stream gives its place under the limit to
    // queued work (StreamLimit). Not in an outage, where every stream is stuck alike.
    const bool up = health_.up();
    int stuck = 0;
    for (const std::shared_ptr<FetchTask>& t : running_conn_) {
      if (t == nullptr) continue;
      if (up && is_stuck(*t)) ++stuck;
      // A batch (RunBatch) that went quiet while a read waits for one of its ranges ends; the
      // ranges it did not bring run alone, the wanted ones as demand work (hedged as such).
      if (!t->companions.empty() && std::chrono::nanoseconds(now - t->last_heard_ns.load()) >= stuck_after(*t, stuck_range) &&
          (spare || std::any_of(t->companions.begin(), t->companions.end(),
                                [](const std::shared_ptr<FetchTask>& c) { return c->leaders->AnyOpenWanted(); }))) {
        t->stalled.store(true);
        t->CancelAttempt();
      }
      if (t->is_hedge || t->hedges.size() >= kMaxHedges) continue;
      // A prefetch is hedged once a demand read waits for one of its chunks, or, a block range,
      // while streams are spare (a whole chunk's copy would cost its whole length again, for a
      // read nobody waits for yet: under a starved CPU an integration test saw chunks sent twice).
      const bool range = t->block_count > 0;
      if (t->priority != FetchPriority::kDemand && !(spare && range) && !t->leaders->AnyOpenWanted()) continue;
      // Another hedge only when every one so far is stuck too (a stall on its stream as well).
      if (!is_stuck(*t) || !std::all_of(t->hedges.begin(), t->hedges.end(), [&](const auto& h) { return is_stuck(*h); })) {
        continue;
      }
      if (!up) continue;  // an outage: another stream would wait as long
      StartHedge(t, now, range ? usual_range : usual_part);
    }
    if (stuck != stuck_) {
      const bool more = stuck > stuck_;
      stuck_ = stuck;
      m_.stuck->Set(stuck);
      if (more && (!demand_.empty() || !prefetch_.empty())) {  // queued work may start in their stead
        SpawnWorkers();
        work_cv_.NotifyAll();
      }
    }
  }
}

void GrpcSource::StartHedge(const std::shared_ptr<FetchTask>& t, int64_t now, int64_t usual) {
  t->stalled.store(true);
  for (const auto& stuck_hedge : t->hedges) stuck_hedge->stalled.store(true);
  const int64_t heard = t->last_heard_ns.load();
  auto h = std::make_shared<FetchTask>();
  h->dataset = t->dataset;
  h->shard = t->shard;
  h->first = t->first;
  h->end = t->end;
  h->first_block = t->first_block;
  h->block_count = t->block_count;
  h->priority = FetchPriority::kDemand;
  h->deadline = t->deadline;
  h->leaders = t->leaders;
  h->is_hedge = true;
  // A whole chunk is re-fetched as kStripes block ranges on as many streams: a copy on one
  // stream would meet a stall as often as the original did.
  h->striped = t->block_count == 0;
  h->original = t;
  t->hedges.push_back(h);
  hedges_.fetch_add(1);
  if (t->block_count > 0) range_hedges_.fetch_add(1);
  SC_LOG_RATE_LIMITED(spdlog::level::debug,
                      "{}: hedging {} [{}, {}) of shard {} of '{}' (no message for {} ms; usual {} ms; {} streams)",
                      Where(), t->block_count > 0 ? "the block range of chunk" : "chunks", t->first, t->end,
                      t->shard, t->dataset->name, (now - heard) / 1000000, usual / 1000000, running_);
  demand_.push_front(std::move(h));  // on another slot: the stuck one stays busy
  SpawnWorkers();
  work_cv_.NotifyOne();
}

void GrpcSource::PreConnect() {
  MutexLock lock(&mu_);
  if (stopping_) return;
  const auto now = Clock::now();
  for (int slot = 0; slot < DemandLimit(); ++slot) {
    if (connections_[slot] != nullptr || slot_busy_[slot]) continue;
    auto conn = std::make_unique<Connection>();
    conn->channel = NewChannel(slot);
    conn->stub = v1::Origin::NewStub(conn->channel);
    conn->channel->GetState(/*try_to_connect=*/true);
    connections_[slot] = std::move(conn);
    slot_used_[slot] = now;
  }
}

void GrpcSource::SpawnWorkers() {
  if (stopping_) return;  // the destructor joins them all
  for (const uint64_t id : exited_) {
    auto it = workers_.find(id);
    it->second.join();  // it has left WorkerLoop; only its return is left
    workers_.erase(it);
  }
  exited_.clear();
  const size_t queued = demand_.size() + prefetch_.size();
  const size_t limit = static_cast<size_t>(demand_.empty() ? StreamLimit() : DemandLimit());
  // Workers not running a task are idle or just started: each takes one queued task.
  while (workers_.size() < limit && workers_.size() - static_cast<size_t>(running_) < queued) {
    const uint64_t id = next_worker_id_++;
    workers_.emplace(id, std::thread([this, id] {
                       NameThisThread("sc-up-fetch");
                       WorkerLoop(id);
                     }));
    m_.workers->Add(1);
  }
}

void GrpcSource::TaskEnded() {
  --running_;
  if (running_ == 0 && stuck_ > 0) {  // HedgeLoop idles now: its last count must not linger
    stuck_ = 0;
    m_.stuck->Set(0);
  }
  running_now_.store(running_);
  m_.in_flight->Set(running_);
  work_cv_.NotifyOne();  // a free slot for the next task
}

std::vector<std::unique_ptr<GrpcSource::Connection>> GrpcSource::TakeIdleConnections(Clock::time_point now) {
  std::vector<std::unique_ptr<Connection>> idle;
  for (size_t i = 0; i < connections_.size(); ++i) {
    if (connections_[i] != nullptr && !slot_busy_[i] && now - slot_used_[i] >= options_.idle_release) {
      idle.push_back(std::move(connections_[i]));
    }
  }
  return idle;
}

namespace {

// The single-flight key of a block range: the chunk's key with the version id replaced by one
// that also names the blocks (a separate table from whole chunks, so the two never mix).
ChunkKey RangeKey(const DatasetPtr& d, uint32_t shard, uint64_t chunk, uint32_t first_block, uint32_t block_count) {
  return ChunkKey{HashBytes(d->version + "/blocks/" + std::to_string(first_block) + "+" + std::to_string(block_count)),
                  shard, chunk};
}

}  // namespace

GrpcSource::Flights::Flight GrpcSource::LaunchRange(const DatasetPtr& d, uint32_t shard, uint64_t chunk,
                                                     uint32_t first_block, uint32_t block_count,
                                                     const ReadOptions& options,
                                                     std::vector<std::shared_ptr<FetchTask>>* mine) {
  Flights::Flight f = range_flights_.Join(RangeKey(d, shard, chunk, first_block, block_count));
  Flights::Flight handle = f.Share();
  if (!f.leader() && options.priority == FetchPriority::kDemand) {
    handle.MarkWanted();
    ExpediteRange(d, shard, chunk, first_block, block_count);
  }
  if (f.leader()) {
    auto task = std::make_shared<FetchTask>();
    task->dataset = d;
    task->shard = shard;
    task->first = chunk;
    task->end = chunk + 1;
    task->first_block = first_block;
    task->block_count = block_count;
    task->priority = options.priority;
    task->deadline = options.deadline;
    task->leaders->Add(chunk, std::move(f));
    mine->push_back(task);
    Submit(std::move(task));
  }
  return handle;
}

Status GrpcSource::ReadPieces(const DatasetPtr& d, uint32_t shard, std::span<const ChunkPiece> pieces,
                              const ReadOptions& options) {
  // Pieces by chunk and offset; a range covers a run of pieces that share blocks. Pieces that
  // only touch stay apart: each range is then the same flight (the same key) whichever read
  // asks for it, a warm read of many samples or a batch of a few.
  std::vector<const ChunkPiece*> order;
  for (const ChunkPiece& p : pieces) {
    SC_RETURN_IF_ERROR(CheckChunkRange(d, shard, p.chunk, 1));
    SC_RETURN_IF_ERROR(CheckPiece(d, shard, p, dataset::ChunkLength(d->manifest, shard, p.chunk)));
    if (p.length > 0) order.push_back(&p);
  }
  std::sort(order.begin(), order.end(), [](const ChunkPiece* a, const ChunkPiece* b) {
    return a->chunk != b->chunk ? a->chunk < b->chunk : a->offset < b->offset;
  });
  std::vector<PieceRange> ranges;
  for (size_t i = 0; i < order.size(); ++i) {
    const ChunkPiece& p = *order[i];
    const uint64_t b0 = p.offset / kChunkBlockBytes, b1 = (p.offset + p.length + kChunkBlockBytes - 1) / kChunkBlockBytes;
    if (!ranges.empty() && ranges.back().chunk == p.chunk && b0 < ranges.back().b1) {
      ranges.back().b1 = std::max(ranges.back().b1, b1);
      ranges.back().end_piece = i + 1;
    } else {
      ranges.push_back(PieceRange{p.chunk, b0, b1, i, i + 1, {}});
    }
  }
  // Launched in the order the caller gave the pieces (a warm read's: the order the samples
  // are needed in), not by chunk: queued ranges start in launch order.
  auto given_at = [&](const PieceRange& r) {
    size_t at = SIZE_MAX;
    for (size_t i = r.first_piece; i < r.end_piece; ++i) at = std::min<size_t>(at, order[i] - pieces.data());
    return at;
  };
  std::vector<std::pair<size_t, size_t>> by_given;  // (first given piece, range)
  for (size_t k = 0; k < ranges.size(); ++k) by_given.emplace_back(given_at(ranges[k]), k);
  std::sort(by_given.begin(), by_given.end());
  std::vector<PieceRange> launch_order;
  launch_order.reserve(ranges.size());
  for (const auto& [at, k] : by_given) launch_order.push_back(std::move(ranges[k]));
  if (options.priority == FetchPriority::kDemand) {
    if (const uint64_t stripes = DemandStripes(launch_order.size()); stripes > 1) {
      return FetchStriped(d, shard, pieces, order, launch_order, stripes, options);
    }
  }
  return FetchRanges(d, shard, pieces.data(), order, launch_order, options);
}

uint64_t GrpcSource::DemandStripes(size_t ranges) {
  if (ranges == 0) return 1;
  MutexLock lock(&mu_);
  const int idle = DemandLimit() - running_ - static_cast<int>(demand_.size());
  if (idle < 2 * static_cast<int>(ranges)) return 1;
  return std::min<uint64_t>(kStripes, static_cast<uint64_t>(idle) / ranges);
}

Status GrpcSource::FetchStriped(const DatasetPtr& d, uint32_t shard, std::span<const ChunkPiece> given,
                                const std::vector<const ChunkPiece*>& order, std::vector<PieceRange>& ranges,
                                uint64_t stripes, const ReadOptions& options) {
  // Stripes per range. A range in flight already (a warm read's) is joined whole, not fetched
  // again in stripes.
  std::vector<uint64_t> cuts;
  cuts.reserve(ranges.size());
  for (const PieceRange& r : ranges) {
    const uint64_t blocks = r.b1 - r.b0;
    const bool running = range_flights_.Running(RangeKey(d, shard, r.chunk, static_cast<uint32_t>(r.b0),
                                                         static_cast<uint32_t>(blocks)));
    cuts.push_back(running ? 1 : std::clamp<uint64_t>(blocks / kMinStripeBlocks, 1, stripes));
  }
  // Nothing to cut (samples of under 4 blocks): the ranges as they are, without the copies.
  if (std::all_of(cuts.begin(), cuts.end(), [](uint64_t n) { return n == 1; })) {
    return FetchRanges(d, shard, given.data(), order, ranges, options);
  }
  std::vector<ChunkPiece> cut;
  std::vector<size_t> source;  // each cut piece's index in `given`
  std::vector<PieceRange> striped;
  for (size_t k = 0; k < ranges.size(); ++k) {
    const PieceRange& r = ranges[k];
    const uint64_t n = cuts[k];
    if (n > 1) striped_ranges_.fetch_add(1);
    const uint64_t per = (r.b1 - r.b0 + n - 1) / n;
    for (uint64_t b = r.b0; b < r.b1; b += per) {
      const uint64_t e = std::min(r.b1, b + per), lo = b * kChunkBlockBytes, hi = e * kChunkBlockBytes;
      const size_t first = cut.size();
      for (size_t i = r.first_piece; i < r.end_piece; ++i) {
        const ChunkPiece& p = *order[i];
        const uint64_t from = std::max(p.offset, lo), to = std::min(p.offset + p.length, hi);
        if (from >= to) continue;
        cut.push_back(ChunkPiece{p.chunk, from, to - from, p.dest + (from - p.offset)});
        source.push_back(static_cast<size_t>(order[i] - given.data()));
      }
      striped.push_back(PieceRange{r.chunk, b, e, first, cut.size(), {}});
    }
  }
  std::vector<const ChunkPiece*> cut_order;
  cut_order.reserve(cut.size());
  for (const ChunkPiece& p : cut) cut_order.push_back(&p);
  std::vector<uint32_t> parts_left(given.size(), 0);
  for (size_t k : source) ++parts_left[k];
  ReadOptions o = options;
  if (options.piece_done) {
    o.piece_done = [&](size_t k) {
      if (--parts_left[source[k]] == 0) options.piece_done(source[k]);
    };
  }
  return FetchRanges(d, shard, cut.data(), cut_order, striped, o);
}

Status GrpcSource::FetchRanges(const DatasetPtr& d, uint32_t shard, const ChunkPiece* given,
                               const std::vector<const ChunkPiece*>& order, std::vector<PieceRange>& ranges,
                               const ReadOptions& options) {
  std::vector<std::shared_ptr<FetchTask>> mine;
  for (PieceRange& r : ranges) {
    r.flight = LaunchRange(d, shard, r.chunk, static_cast<uint32_t>(r.b0), static_cast<uint32_t>(r.b1 - r.b0), options, &mine);
  }
  auto cancel_mine = [&] {
    for (auto& t : mine) t->Cancel();
  };
  std::vector<bool> copied(ranges.size(), false);
  auto copy_out = [&](size_t k, const Chunk& bytes) {
    const PieceRange& r = ranges[k];
    for (size_t i = r.first_piece; i < r.end_piece; ++i) {
      const ChunkPiece& p = *order[i];
      std::memcpy(p.dest, bytes.bytes.data() + (p.offset - r.b0 * kChunkBlockBytes), p.length);
      if (options.piece_done) options.piece_done(static_cast<size_t>(order[i] - given));
    }
    copied[k] = true;
  };
  for (size_t k = 0; k < ranges.size(); ++k) {
    if (copied[k]) continue;
    PieceRange& r = ranges[k];
    std::optional<ChunkResult> v;
    // A leader that gave up (another caller's, cancelled): fetch the range ourselves.
    for (int rejoins = 0;; ++rejoins) {
      v = r.flight.Wait(options.deadline + std::chrono::seconds(2));
      if (!v || v->ok() || v->status().code() != StatusCode::kAborted || Clock::now() >= options.deadline ||
          rejoins >= 4 * options_.max_retries + 4) {
        break;
      }
      r.flight = LaunchRange(d, shard, r.chunk, static_cast<uint32_t>(r.b0), static_cast<uint32_t>(r.b1 - r.b0), options, &mine);
    }
    if (!v) {
      cancel_mine();
      return Unavailable(Where() + ": blocks [" + std::to_string(r.b0) + ", " + std::to_string(r.b1) + ") of chunk " +
                         std::to_string(r.chunk) + " of shard " + std::to_string(shard) + " of '" + d->name +
                         "' not received before the deadline");
    }
    if (!v->ok()) {
      cancel_mine();
      return v->status();
    }
    copy_out(k, ***v);
    // Ranges that landed meanwhile are handed over now, not when the wait reaches them.
    for (size_t j = k + 1; j < ranges.size() && options.piece_done; ++j) {
      if (copied[j]) continue;
      if (std::optional<ChunkResult> done = ranges[j].flight.TryGet(); done && done->ok()) copy_out(j, ***done);
    }
  }
  return Status::Ok();
}

void GrpcSource::RunStriped(FetchTask& task) {
  const uint64_t c = task.leaders->NextOpen(task.first, task.end);
  if (c >= task.end || task.cancelled.load()) return;
  const auto& m = task.dataset->manifest;
  const uint64_t len = dataset::ChunkLength(m, task.shard, c);
  const uint64_t blocks = (len + kChunkBlockBytes - 1) / kChunkBlockBytes;
  auto chunk = std::make_shared<Chunk>();
  chunk->bytes = AlignedBuffer(len);
  // The blocks the original already brought of this chunk are taken from it, not fetched again.
  const std::shared_ptr<FetchTask> original = task.original.lock();
  uint64_t have = 0;
  if (original) {
    MutexLock l(&original->partial.mu);
    if (original->partial.chunk == c) have = original->partial.filled / kChunkBlockBytes * kChunkBlockBytes;
  }
  const uint64_t first = have / kChunkBlockBytes;
  const uint64_t per = std::max<uint64_t>(1, (blocks - first + kStripes - 1) / kStripes);
  std::vector<ChunkPiece> pieces;
  std::vector<PieceRange> ranges;
  for (uint64_t b = first; b < blocks; b += per) {
    const uint64_t b1 = std::min(blocks, b + per), offset = b * kChunkBlockBytes;
    pieces.push_back(ChunkPiece{c, offset, std::min(len, b1 * kChunkBlockBytes) - offset, chunk->bytes.data() + offset});
    ranges.push_back(PieceRange{c, b, b1, pieces.size() - 1, pieces.size(), {}});
  }
  std::vector<const ChunkPiece*> order;
  for (const ChunkPiece& p : pieces) order.push_back(&p);
  ReadOptions o;
  o.priority = FetchPriority::kDemand;
  o.deadline = task.deadline;
  // A hedge never publishes a failure: the original may still bring the chunk.
  if (!FetchRanges(task.dataset, task.shard, pieces.data(), order, ranges, o).ok()) return;
  if (have > 0) {
    MutexLock l(&original->partial.mu);
    // Gone when the original finished the chunk meanwhile (then it published it).
    if (original->partial.chunk != c || original->partial.filled < have) return;
    std::memcpy(chunk->bytes.data(), original->partial.bytes.data(), have);
  }
  // Every fetched block was checked against the chunk's verified block table; the root is
  // checked over all of it, the original's part included.
  chunk->hash = ChunkDigest(chunk->bytes.data(), len);
  if (chunk->hash != dataset::ChunkHash(m, task.shard, c)) {
    checksum_failures_.fetch_add(1);
    return;
  }
  task.leaders->Publish(c, ChunkResult(ChunkPtr(std::move(chunk))));
}

void GrpcSource::WorkerLoop(uint64_t id) {
  MutexLock lock(&mu_);
  auto idle_since = Clock::now();
  while (true) {
    const bool has_work = work_cv_.WaitUntil(&mu_, idle_since + options_.idle_release, [&]() REQUIRES(mu_) {
      return stopping_ || (!demand_.empty() && running_ < DemandLimit()) ||
             (!prefetch_.empty() && running_ < StreamLimit());
    });
    if (stopping_ || !has_work) break;  // stopping, or idle for idle_release: the pool shrinks
    // Demand first: prefetch work starts only when no demand work waits (and within the limit).
    auto& queue = !demand_.empty() ? demand_ : prefetch_;
    std::shared_ptr<FetchTask> task = std::move(queue.front());
    queue.pop_front();
    std::vector<std::shared_ptr<FetchTask>> companions;
    if (&queue == &prefetch_ && Batchable(*task)) companions = TakeCompanions(*task);
    task->companions = companions;
    // The lowest free slot, so that slots past what the load needs fall idle and close.
    size_t slot = 0;
    while (slot_busy_[slot]) ++slot;  // running_ < limit <= slots, so one is free
    slot_busy_[slot] = true;
    running_conn_[slot] = task;
    if (connections_[slot] == nullptr) {
      auto conn = std::make_unique<Connection>();
      conn->channel = NewChannel(static_cast<int>(slot));
      conn->stub = v1::Origin::NewStub(conn->channel);
      connections_[slot] = std::move(conn);
    }
    Connection& conn = *connections_[slot];  // stays while the slot is busy
    ++running_;
    if (running_ == 1) cv_.NotifyAll();  // the hedger's look begins
    running_now_.store(running_);
    // Work still waits only if every slot the limit allows is taken.
    if ((!demand_.empty() || !prefetch_.empty()) && running_ >= StreamLimit()) waited_.store(true);
    m_.in_flight->Set(running_);
    lock.Unlock();
    if (!task->cancelled.load()) {
      if (task->striped) {
        RunStriped(*task);
      } else {
        if (!companions.empty()) RunBatch(*task, companions, conn);
        RunTask(*task, conn);
      }
    }
    lock.Lock();
    running_conn_[slot] = nullptr;
    std::unique_ptr<Connection> stalled_conn;
    if (task->stalled.load() && connections_[slot] != nullptr) {  // the next task connects anew
      stalled_conn = std::move(connections_[slot]);
      stalled_connections_.fetch_add(1);
    }
    // The tasks racing this one that it ends: an original's hedges; for a hedge done with every
    // chunk, the original's attempt (stuck, or fetching copies) and the other hedges'.
    std::vector<std::shared_ptr<FetchTask>> racing = std::move(task->hedges);
    if (auto original = task->original.lock();
        task->is_hedge && original && task->leaders->NextOpen(task->first, task->end) == task->end) {
      racing = original->hedges;
      racing.push_back(original);
    }
    lock.Unlock();
    stalled_conn.reset();  // closed outside mu_
    if (task->is_hedge) {
      for (const auto& other : racing) {
        if (other != task) other->CancelAttempt();
      }
    } else {
      for (const auto& hedge : racing) hedge->Cancel();
      // Leaders left unpublished (cancelled) publish Aborted now, so their waiters refetch.
      task->leaders->Drop();
    }
    task.reset();
    lock.Lock();
    slot_busy_[slot] = false;
    idle_since = slot_used_[slot] = Clock::now();
    TaskEnded();
  }
  exited_.push_back(id);
  m_.workers->Add(-1);
}

void GrpcSource::ObserveProgress(uint64_t chunk_bytes, std::chrono::nanoseconds chunk_time) {
  const int before = controller_.limit();
  controller_.Observe(Clock::now(), wire_bytes_.load(), waited_.exchange(false), chunk_bytes, chunk_time,
                      running_now_.load());
  const int after = controller_.limit();
  m_.goodput->Set(controller_.goodput());
  if (after != before) {
    m_.stream_limit->Set(after);
    spdlog::debug("{}: stream limit {} -> {} (goodput {:.1f} MB/s, last chunk {:.2f} s on its stream)", Where(),
                  before, after, controller_.goodput() / 1e6, std::chrono::duration<double>(chunk_time).count());
    {
      MutexLock lock(&mu_);
      SpawnWorkers();
    }
    work_cv_.NotifyAll();
  }
}

// Where a task stands across its attempts.
struct GrpcSource::TaskProgress {
  explicit TaskProgress(uint64_t first) : next(first) {}
  uint64_t next;       // the first chunk not yet published
  int failures = 0;    // consecutive attempts without progress (sets the backoff)
  int mismatches = 0;  // failed verifications of chunk `next`
  Status last;         // the last attempt's error
  ChunkDecoder decoder;
  BlockTablePtr table;  // a block range's: the chunk's verified block table, once known
  // A batched range whose table another stream was asked for (BlockTables::Claim): its
  // message comes without one, and its check waits a while for that table.
  bool table_elsewhere = false;
};

// What one attempt (one ReadChunks stream) did.
struct GrpcSource::Attempt {
  bool progressed = false;
  bool stopped_early = false;  // we left the stream before the server ended it
  Status local;                // a problem we found in what arrived
  Clock::time_point last_heard;
  Clock::duration chunk_time{};  // between the last message and the one before (or the start)
  Clock::time_point chunk_began;  // the last chunk's end (or the start): a chunk's time on its stream
  bool answered = false;         // a message arrived
  grpc::Status finished;         // the stream's own status
};

GrpcSource::Attempt GrpcSource::BeginAttempt(std::span<FetchTask* const> tasks) {
  streams_.fetch_add(1);
  Attempt a;
  a.last_heard = a.chunk_began = Clock::now();
  for (FetchTask* t : tasks) {
    t->answered.store(false);
    t->last_heard_ns.store(a.last_heard.time_since_epoch().count());
  }
  return a;
}

void GrpcSource::Heard(Attempt& a, std::span<FetchTask* const> tasks) {
  const auto now = Clock::now();
  a.chunk_time = now - a.last_heard;
  a.last_heard = now;
  if (!a.answered) first_times_.Add(std::chrono::duration_cast<std::chrono::nanoseconds>(a.chunk_time).count());
  a.answered = true;
  for (FetchTask* t : tasks) {
    t->answered.store(true);
    t->last_heard_ns.store(now.time_since_epoch().count());
  }
  health_.OnAnswer();
}

void GrpcSource::FailRest(FetchTask& task, TaskProgress& p, const Status& s) {
  if (!task.is_hedge) {  // a hedge's failure leaves the chunks to its original
    for (uint64_t c = p.next; c < task.end; ++c) task.leaders->Publish(c, s);
  }
  p.next = task.end;
}

void GrpcSource::RunTask(FetchTask& task, Connection& conn) {
  TaskProgress p(task.first);
  while ((p.next = task.leaders->NextOpen(p.next, task.end)) < task.end) {  // a hedge may be ahead
    if (task.cancelled.load()) return;
    const auto now = Clock::now();
    if (now >= task.deadline) {
      FailRest(task, p,
               Unavailable(Where() + ": chunks [" + std::to_string(p.next) + ", " + std::to_string(task.end) +
                           ") of shard " + std::to_string(task.shard) + " of '" + task.dataset->name +
                           "' not received before the deadline" +
                           (p.last.ok() ? std::string() : "; last error: " + p.last.ToString())));
      return;
    }
    // During an outage an attempt that starts after it has lasted outage_timeout is not made;
    // one that runs then is ended by ProbeLoop. Not by its own deadline: an attempt made while
    // the upstream was silent (a member still starting) must not be cut at that bound once the
    // upstream answers again, only because its first message is slow.
    if (now >= health_.GiveUpAt()) {
      FailRest(task, p, health_.OutageError());
      return;
    }
    grpc::ClientContext ctx;
    ctx.set_deadline(ToSystem(std::min(task.deadline, now + options_.call_timeout)));
    AddAuth(&ctx);
    {
      MutexLock lock(&task.ctx_mu);
      task.ctx = &ctx;
    }
    if (task.cancelled.load()) ctx.TryCancel();
    const Attempt a = Stream(task, conn, ctx, p);
    {
      MutexLock lock(&task.ctx_mu);
      task.ctx = nullptr;
    }
    if (p.next >= task.end || task.cancelled.load()) return;
    if (!BackOffAfter(task, a, p)) return;
  }
}

v1::ReadChunksRequest GrpcSource::RequestFor(const FetchTask& task, TaskProgress& p) {
  v1::ReadChunksRequest req;
  req.set_dataset(task.dataset->name);
  req.set_version(task.dataset->version);
  req.set_shard(task.shard);
  req.set_first_chunk(p.next);
  req.set_chunk_count(task.end - p.next);
  req.set_priority(task.priority == FetchPriority::kDemand ? v1::DEMAND : v1::PREFETCH);
  req.set_accept_zstd(options_.accept_zstd);
  req.set_from_peer(options_.from_peer);
  if (task.block_count > 0) {
    req.set_first_block(task.first_block);
    req.set_block_count(task.block_count);
    if (!p.table) p.table = tables_.Get(ChunkKey{VersionId(task.dataset->version), task.shard, task.first});
    req.set_want_block_table(p.table == nullptr && !p.table_elsewhere);
  } else {
    req.set_part_blocks(options_.part_blocks);
  }
  return req;
}

GrpcSource::Attempt GrpcSource::Stream(FetchTask& task, Connection& conn, grpc::ClientContext& ctx,
                                       TaskProgress& p) {
  const v1::ReadChunksRequest req = RequestFor(task, p);
  {
    MutexLock l(&task.partial.mu);  // a chunk cut off in an earlier attempt starts again
    task.partial.chunk = UINT64_MAX;
    task.partial.filled = 0;
  }
  FetchTask* const self = &task;
  Attempt a = BeginAttempt({&self, 1});
  auto reader = conn.stub->ReadChunks(&ctx, req);
  v1::ChunkMessage msg;
  while (reader->Read(&msg)) {
    Heard(a, {&self, 1});
    if (!Receive(task, msg, p, a)) {
      a.stopped_early = true;
      break;
    }
  }
  // Cancel only a stream we abandoned; cancelling one the server already ended would replace
  // its status (e.g. DataLoss, Unauthenticated) with CANCELLED.
  if (a.stopped_early) ctx.TryCancel();
  a.finished = reader->Finish();
  return a;
}

bool GrpcSource::Batchable(const FetchTask& t) {
  return t.block_count > 0 && t.priority == FetchPriority::kPrefetch && !t.is_hedge && !t.striped && !t.alone &&
         !t.cancelled.load();
}

std::vector<std::shared_ptr<GrpcSource::FetchTask>> GrpcSource::TakeCompanions(const FetchTask& first) {
  // A look at the next few queued tasks only: the queue may hold thousands.
  constexpr size_t kScan = 4 * kBatchRanges;
  std::vector<std::shared_ptr<FetchTask>> out;
  uint64_t bytes = uint64_t{first.block_count} * kChunkBlockBytes;
  for (auto it = prefetch_.begin(); it != prefetch_.end() && std::distance(prefetch_.begin(), it) < static_cast<long>(kScan);) {
    const FetchTask& t = **it;
    const uint64_t b = uint64_t{t.block_count} * kChunkBlockBytes;
    if (out.size() + 1 >= kBatchRanges || bytes + b > kBatchBytes) break;
    if (Batchable(t) && t.dataset->version == first.dataset->version) {
      bytes += b;
      out.push_back(std::move(*it));
      it = prefetch_.erase(it);
    } else {
      ++it;
    }
  }
  return out;
}

void GrpcSource::RunBatch(FetchTask& first, std::vector<std::shared_ptr<FetchTask>>& companions, Connection& conn) {
  std::vector<FetchTask*> tasks{&first};
  for (const auto& t : companions) tasks.push_back(t.get());
  const auto now = Clock::now();
  Clock::time_point deadline = now + options_.call_timeout;
  for (const FetchTask* t : tasks) deadline = std::min(deadline, t->deadline);
  if (now < deadline && now < health_.GiveUpAt()) {
    grpc::ClientContext ctx;
    ctx.set_deadline(ToSystem(deadline));
    AddAuth(&ctx);
    for (FetchTask* t : tasks) {
      MutexLock lock(&t->ctx_mu);
      t->ctx = &ctx;
    }
    if (std::any_of(tasks.begin(), tasks.end(), [](const FetchTask* t) { return t->cancelled.load(); })) {
      ctx.TryCancel();
    }
    StreamBatch(tasks, conn, ctx);
    for (FetchTask* t : tasks) {
      MutexLock lock(&t->ctx_mu);
      t->ctx = nullptr;
    }
  }
  {
    MutexLock lock(&mu_);
    first.companions.clear();
  }
  for (auto& t : companions) {
    if (t->cancelled.load() || t->leaders->NextOpen(t->first, t->end) >= t->end) {
      t->leaders->Drop();  // as WorkerLoop ends a task: the unpublished (cancelled) get Aborted
      continue;
    }
    t->alone = true;
    if (t->leaders->AnyOpenWanted()) t->priority = FetchPriority::kDemand;
    Submit(std::move(t));
  }
}

size_t GrpcSource::StreamBatch(const std::vector<FetchTask*>& given, Connection& conn, grpc::ClientContext& ctx) {
  // Each chunk's table is asked for once over all batches in flight. The ranges that wait for a
  // table another stream brings go last: this stream's own tables all arrive before any of its
  // ranges waits, so two batches never wait for each other.
  std::vector<FetchTask*> tasks, waiting;
  std::deque<TaskProgress> ps;  // in the order of `tasks`
  for (FetchTask* t : given) {
    const ChunkKey key{VersionId(t->dataset->version), t->shard, t->first};
    BlockTablePtr table = tables_.Get(key);
    if (!table && !tables_.Claim(key, kTableWait)) {
      waiting.push_back(t);
      continue;
    }
    tasks.push_back(t);
    ps.emplace_back(t->first).table = std::move(table);
  }
  for (FetchTask* t : waiting) {
    tasks.push_back(t);
    // The first asks for its table after all when every range waits for one.
    ps.emplace_back(t->first).table_elsewhere = tasks.size() > 1;
  }
  v1::ReadChunksRequest req = RequestFor(*tasks[0], ps[0]);
  for (size_t i = 1; i < tasks.size(); ++i) {
    const FetchTask& t = *tasks[i];
    v1::BlockRange* r = req.add_more_ranges();
    r->set_shard(t.shard);
    r->set_chunk(t.first);
    r->set_first_block(t.first_block);
    r->set_block_count(t.block_count);
    r->set_want_block_table(ps[i].table == nullptr && !ps[i].table_elsewhere);
  }
  Attempt a = BeginAttempt(tasks);
  auto reader = conn.stub->ReadChunks(&ctx, req);
  v1::ChunkMessage msg;
  size_t at = 0, taken = 0;  // the range the next message is for; those taken so far
  while (at < tasks.size() && reader->Read(&msg)) {
    // The ranges still to come are not stuck while their stream moves (HedgeLoop looks at the
    // task the worker runs, which may have come first).
    Heard(a, tasks);
    const bool go_on = Receive(*tasks[at], msg, ps[at], a);
    if (ps[at].next < tasks[at]->end) {
      // Not taken. A range that failed its checks (or whose table did not come) runs alone
      // later; the stream goes on with the next. Any other problem ends the stream.
      if (a.local.code() != StatusCode::kDataLoss && a.local.code() != StatusCode::kUnavailable) break;
      a.local = Status::Ok();
    } else {
      ++taken;
    }
    ++at;
    if (!go_on && ps[at - 1].next >= tasks[at - 1]->end) break;  // cancelled
  }
  // Cancel only a stream we leave: the server ended the others (an origin that predates
  // more_ranges ends after the first range).
  if (at < tasks.size()) ctx.TryCancel();
  (void)reader->Finish();
  return taken;
}

bool GrpcSource::Receive(FetchTask& task, const v1::ChunkMessage& msg, TaskProgress& p, Attempt& a) {
  const auto& m = task.dataset->manifest;
  const uint64_t wire = msg.payload().size() + msg.block_table().size();
  wire_bytes_.fetch_add(wire);
  if (Status b = bucket_.Take(wire, task.deadline); !b.ok()) {
    a.local = b;
    return false;
  }
  const bool range = task.block_count > 0;
  // A range comes whole; a whole chunk may come in parts, each starting where the last ended.
  uint64_t want_block = task.first_block;
  if (!range) {
    MutexLock l(&task.partial.mu);
    want_block = task.partial.chunk == p.next ? task.partial.filled / kChunkBlockBytes : 0;
  }
  if (msg.chunk() != p.next || msg.first_block() != want_block) {
    a.local = Internal(Where() + " sent chunk " + std::to_string(msg.chunk()) + " from block " +
                       std::to_string(msg.first_block()) + ", expected chunk " + std::to_string(p.next) +
                       " from block " + std::to_string(want_block));
    return false;
  }
  uint64_t len = dataset::ChunkLength(m, task.shard, p.next);
  std::string where = Where() + " dataset '" + task.dataset->name + "' shard " + std::to_string(task.shard) +
                      " ('" + m.shards(static_cast<int>(task.shard)).path() + "') chunk " + std::to_string(p.next) +
                      " (offset " + std::to_string(p.next * m.chunk_bytes()) + ")";
  if (range) {
    const uint64_t begin = uint64_t{task.first_block} * kChunkBlockBytes;
    len = std::min<uint64_t>(len, begin + uint64_t{task.block_count} * kChunkBlockBytes) - begin;
    where += " blocks [" + std::to_string(task.first_block) + ", +" + std::to_string(task.block_count) + ")";
  }
  auto chunk = std::make_shared<Chunk>();
  Status v;
  if (range) {
    v = p.decoder.Decode(msg, len, where, &chunk->bytes);
    if (v.ok()) v = VerifyRange(task, msg, p, *chunk, where);
  } else {
    bool whole = false;
    v = TakePart(msg, len, where, p, task.partial, &chunk->bytes, &whole);
    if (v.ok() && !whole) {  // more parts to come: the stream is alive
      chunk_times_.Add(std::chrono::duration_cast<std::chrono::nanoseconds>(a.chunk_time).count());
      return !task.cancelled.load();
    }
  }
  if (v.ok() && !range) v = VerifyRoot(task, p.next, *chunk, where);
  if (!v.ok() && v.code() != StatusCode::kDataLoss) {  // not a check that failed: the range runs again
    a.local = v;
    return false;
  }
  if (!v.ok()) {
    checksum_failures_.fetch_add(1);
    SC_LOG_RATE_LIMITED(spdlog::level::warn, "refetching: {}", v.message());
    if (++p.mismatches > options_.max_retries) {
      FailRest(task, p, DataLoss(v.message() + " (failed verification " + std::to_string(p.mismatches) + " times)"));
    } else {
      a.local = v;
    }
    return false;
  }
  // Count before publishing: a caller may read stats() as soon as it has the chunk.
  (range ? block_ranges_ : chunks_).fetch_add(1);
  payload_bytes_.fetch_add(len + msg.block_table().size());
  task.leaders->Publish(p.next, ChunkResult(ChunkPtr(std::move(chunk))));
  ++p.next;
  p.mismatches = 0;
  a.progressed = true;
  (range ? range_times_ : chunk_times_).Add(std::chrono::duration_cast<std::chrono::nanoseconds>(a.chunk_time).count());
  // A range's time on its stream is mostly one round trip: reported as a chunk's, it would make
  // the controller judge its raises before any whole chunk could show their effect.
  if (range) {
    ObserveProgress(0, std::chrono::nanoseconds(0));
  } else {
    ObserveProgress(len, a.last_heard - a.chunk_began);
  }
  a.chunk_began = a.last_heard;
  if (p.next < task.end && task.leaders->NextOpen(p.next, task.end) == task.end) {
    p.next = task.end;  // the rest came on the hedge's (or the original's) stream
    return false;
  }
  return !task.cancelled.load();
}

Status GrpcSource::VerifyRoot(const FetchTask& task, uint64_t index, Chunk& chunk, const std::string& where) {
  chunk.hash = ChunkDigest(chunk.bytes.data(), chunk.bytes.size());
  const Hash128 want = dataset::ChunkHash(task.dataset->manifest, task.shard, index);
  if (chunk.hash == want) return Status::Ok();
  return DataLoss(where + ": the Merkle root (xxh3-128 over 16 KiB blocks) of the received bytes is " + chunk.hash.ToHex() +
                  ", the manifest says " + want.ToHex());
}

Status GrpcSource::TakePart(const v1::ChunkMessage& msg, uint64_t len, const std::string& where, TaskProgress& p,
                            PartialChunk& partial, AlignedBuffer* out, bool* whole) {
  // Only this stream writes `partial`; the lock is for its hedge, which reads it, so decoding
  // runs outside it.
  uint64_t at;
  {
    MutexLock l(&partial.mu);
    at = partial.chunk == p.next ? partial.filled : 0;
  }
  if (at == 0 && msg.raw_bytes() == len) {  // the chunk in one message (also from older servers)
    *whole = true;
    return p.decoder.Decode(msg, len, where, out);
  }
  if (msg.raw_bytes() == 0 || msg.raw_bytes() > len - at) {
    return DataLoss(where + ": a part of " + std::to_string(msg.raw_bytes()) + " bytes at byte " + std::to_string(at) +
                    " does not fit the chunk's " + std::to_string(len) + " bytes");
  }
  AlignedBuffer part;
  SC_RETURN_IF_ERROR(
      p.decoder.Decode(msg, msg.raw_bytes(), where + " part at block " + std::to_string(msg.first_block()), &part));
  MutexLock l(&partial.mu);
  if (at == 0) {
    partial.chunk = p.next;
    partial.bytes = AlignedBuffer(len);
  }
  std::memcpy(partial.bytes.data() + at, part.data(), part.size());
  partial.filled = at + part.size();
  *whole = partial.filled == len;
  if (*whole) {
    *out = std::move(partial.bytes);
    partial.chunk = UINT64_MAX;
    partial.filled = 0;
  }
  return Status::Ok();
}

Status GrpcSource::VerifyRange(const FetchTask& task, const v1::ChunkMessage& msg, const TaskProgress& p,
                               const Chunk& range, const std::string& where) {
  const auto& m = task.dataset->manifest;
  BlockTablePtr table = p.table;
  if (!msg.block_table().empty()) {
    SC_RETURN_IF_ERROR(CheckBlockTable(msg.block_table(), dataset::ChunkLength(m, task.shard, task.first),
                                       dataset::ChunkHash(m, task.shard, task.first), where));
    table = std::make_shared<const std::string>(msg.block_table());
    block_tables_.fetch_add(1);
    tables_.Put(ChunkKey{VersionId(task.dataset->version), task.shard, task.first}, table);
    return CheckBlocks(*table, task.first_block, range.bytes.data(), range.bytes.size(), where);
  }
  const ChunkKey key{VersionId(task.dataset->version), task.shard, task.first};
  if (!table) table = tables_.Get(key);  // another stream may have brought it since
  if (!table && p.table_elsewhere) table = tables_.WaitFor(key, std::min(task.deadline, Clock::now() + kTableWait));
  if (!table) {
    return p.table_elsewhere ? Unavailable(where + ": the block table asked for on another stream did not come")
                             : DataLoss(where + ": the upstream sent no block table and none is known");
  }
  return CheckBlocks(*table, task.first_block, range.bytes.data(), range.bytes.size(), where);
}

bool GrpcSource::BackOffAfter(FetchTask& task, const Attempt& a, TaskProgress& p) {
  // A hedge that brought the rest ends this attempt: done, not a failure of the upstream.
  if (task.leaders->NextOpen(p.next, task.end) == task.end) return true;
  Status s = a.local.ok() ? FromGrpcStatus(a.finished) : a.local;
  if (s.ok()) {
    s = Unavailable("stream ended at chunk " + std::to_string(p.next) + " before the end of the range");
  }
  if (a.local.ok() && s.code() == StatusCode::kResourceExhausted) {
    // The upstream caps our calls: settle below the count that ran when it said so.
    int running = 0;
    {
      MutexLock lock(&mu_);
      running = running_;
    }
    controller_.Refused(running);
    m_.stream_limit->Set(controller_.limit());
    SC_LOG_RATE_LIMITED(spdlog::level::warn, "{} refused a stream with {} running ({}); stream limit now {}", Where(),
                        running, s.message(), controller_.limit());
  }
  if (a.local.ok() && !Retryable(s.code())) {
    if (ProbeAnswered(s)) health_.OnAnswer();
    FailRest(task, p, s.WithContext(Where()));
    return false;
  }
  p.last = s;
  // Transport failures are retried until the caller's deadline (checked at the loop top) or
  // the end of the outage bound: an upstream that comes back in time is used, one that does
  // not ends as Unavailable naming it and the last error.
  if (a.local.ok()) {
    // Past the bound (this attempt may have been ended by ProbeLoop): the outage error, not
    // the cancellation, is what the caller needs to see.
    if (Clock::now() >= health_.GiveUpAt()) {
      FailRest(task, p, health_.OutageError());
      return false;
    }
    const bool give_up = health_.OnFailure(s, a.last_heard);
    probe_cv_.NotifyAll();
    if (give_up) {
      FailRest(task, p, health_.OutageError());
      return false;
    }
  }
  p.failures = a.progressed ? 0 : p.failures + 1;
  retries_.fetch_add(1);
  spdlog::debug("{}: retrying shard {} of '{}' from chunk {}: {}", Where(), task.shard, task.dataset->name, p.next,
                s.ToString());
  const auto backoff = std::min(options_.backoff_max, options_.backoff_initial * (1 << std::min(p.failures, 10)));
  return SleepUntil(std::min({task.deadline, Clock::now() + Jittered(backoff), health_.GiveUpAt()}));
}

Status GrpcSource::ReadChunks(const DatasetPtr& d, uint32_t shard, uint64_t first, uint64_t count,
                              const ReadOptions& options, const ChunkSink& sink) {
  SC_RETURN_IF_ERROR(CheckChunkRange(d, shard, first, count));
  const uint64_t end = first + count;
  // Sub-range size: at most chunks_per_stream, and small enough that even a short range gives
  // every stream slot work with some left waiting (2 x limit sub-ranges): a shard of 16 chunks
  // must not become 2 streams on a link that needs 8 (each capped at window / RTT), and the
  // waiting work is what lets the controller see that more streams would help.
  const uint64_t limit_now = static_cast<uint64_t>(controller_.limit());
  const uint64_t per = std::clamp<uint64_t>((count + 2 * limit_now - 1) / (2 * limit_now), 1,
                                            static_cast<uint64_t>(options_.chunks_per_stream));
  std::deque<Flights::Flight> pending;  // handles for chunks [delivered, launched)
  std::vector<std::shared_ptr<FetchTask>> mine;
  uint64_t launched = first, delivered = first;
  int rejoins = 0;
  auto launch = [&](uint64_t from, uint64_t to, bool front) { Launch(d, shard, from, to, options, front, &pending, &mine); };
  auto cancel_mine = [&] {
    for (auto& t : mine) t->Cancel();
  };
  // The in-flight budget this call holds: the bytes of chunks [delivered, launched).
  auto bytes_of = [&](uint64_t from, uint64_t to) {
    uint64_t b = 0;
    for (uint64_t c = from; c < to; ++c) b += dataset::ChunkLength(d->manifest, shard, c);
    return b;
  };
  struct Held {
    GrpcSource* source;
    uint64_t bytes = 0;
    ~Held() { source->ReleaseInFlight(bytes); }
  } held{this};

  while (delivered < end) {
    const uint64_t window = per * static_cast<uint64_t>(controller_.limit() + 1);
    while (launched < end && launched - delivered < window) {
      const uint64_t stop = std::min(end, launched + per);
      const uint64_t bytes = bytes_of(launched, stop);
      if (!ReserveInFlight(bytes, /*force=*/launched == delivered)) break;
      held.bytes += bytes;
      launch(launched, stop, false);
      launched = stop;
    }
    // Our own tasks publish by the deadline; allow a little past it for the last messages.
    auto v = pending.front().Wait(options.deadline + std::chrono::seconds(2));
    if (!v) {
      cancel_mine();
      return Unavailable(Where() + ": chunk " + std::to_string(delivered) + " of shard " +
                         std::to_string(shard) + " of '" + d->name +
                         "' not received before the deadline");
    }
    if (!v->ok()) {
      // A leader that gave up (another caller's, cancelled): fetch the chunk ourselves.
      if (v->status().code() == StatusCode::kAborted && Clock::now() < options.deadline &&
          rejoins++ < 4 * options_.max_retries + 4) {
        pending.pop_front();
        launch(delivered, delivered + 1, true);
        continue;
      }
      cancel_mine();
      return v->status();
    }
    Status s = sink(delivered, **v);
    if (!s.ok()) {
      cancel_mine();
      return s;
    }
    pending.pop_front();
    const uint64_t bytes = bytes_of(delivered, delivered + 1);
    ReleaseInFlight(bytes);
    held.bytes -= bytes;
    ++delivered;
  }
  return Status::Ok();
}

bool GrpcSource::ReserveInFlight(uint64_t bytes, bool force) {
  uint64_t now = in_flight_bytes_.load();
  do {
    if (!force && now + bytes > options_.max_in_flight_bytes) return false;
  } while (!in_flight_bytes_.compare_exchange_weak(now, now + bytes));
  m_.in_flight_bytes->Add(static_cast<double>(bytes));
  return true;
}

void GrpcSource::ReleaseInFlight(uint64_t bytes) {
  if (bytes == 0) return;
  in_flight_bytes_.fetch_sub(bytes);
  m_.in_flight_bytes->Add(-static_cast<double>(bytes));
}

void GrpcSource::Launch(const DatasetPtr& d, uint32_t shard, uint64_t from, uint64_t to,
                        const ReadOptions& options, bool front, std::deque<Flights::Flight>* pending,
                        std::vector<std::shared_ptr<FetchTask>>* mine) {
  std::vector<Flights::Flight> handles;
  std::shared_ptr<FetchTask> task;
  const Hash128 version = VersionId(d->version);
  auto flush = [&] {
    if (task) {
      mine->push_back(task);
      Submit(std::move(task));
      task.reset();
    }
  };
  for (uint64_t c = from; c < to; ++c) {
    Flights::Flight f = flights_.Join(ChunkKey{version, shard, c});
    handles.push_back(f.Share());
    if (!f.leader() && options.priority == FetchPriority::kDemand) Expedite(ChunkKey{version, shard, c});
    if (f.leader()) {
      if (!task) {
        task = std::make_shared<FetchTask>();
        task->dataset = d;
        task->shard = shard;
        task->first = c;
        task->end = c;
        task->priority = options.priority;
        task->deadline = options.deadline;
      }
      task->leaders->Add(c, std::move(f));
      task->end = c + 1;
    } else {
      flush();
    }
  }
  flush();
  if (front) {
    for (auto it = handles.rbegin(); it != handles.rend(); ++it) pending->push_front(std::move(*it));
  } else {
    for (auto& h : handles) pending->push_back(std::move(h));
  }
}

void GrpcSource::VisitStats(const stats::Visitor& visit) const {
  stats::Counter(visit, kWireBytes, wire_bytes_.load());
  stats::Counter(visit, kPayloadBytes, payload_bytes_.load());
  stats::Counter(visit, kChunks, chunks_.load());
  stats::Counter(visit, kBlockRanges, block_ranges_.load());
  stats::Counter(visit, kBlockTables, block_tables_.load());
  stats::Counter(visit, kStreams, streams_.load());
  stats::Counter(visit, kRetries, retries_.load());
  stats::Counter(visit, kChecksumFailures, checksum_failures_.load());
  stats::Counter(visit, kHedges, hedges_.load());
  stats::Counter(visit, kRangeHedges, range_hedges_.load());
  stats::Counter(visit, kStalledConnections, stalled_connections_.load());
  stats::Counter(visit, kStripedRanges, striped_ranges_.load());
}

GrpcSource::Stats GrpcSource::stats() const {
  Stats s;
  s.wire_bytes = wire_bytes_.load();
  s.payload_bytes = payload_bytes_.load();
  s.chunks = chunks_.load();
  s.block_ranges = block_ranges_.load();
  s.streams = streams_.load();
  s.retries = retries_.load();
  s.checksum_failures = checksum_failures_.load();
  s.hedges = hedges_.load();
  s.range_hedges = range_hedges_.load();
  s.stalled_connections = stalled_connections_.load();
  s.striped_ranges = striped_ranges_.load();
  s.stream_limit = controller_.limit();
  s.goodput_bytes_per_s = controller_.goodput();
  s.in_flight_bytes = in_flight_bytes_.load();
  MutexLock lock(&mu_);
  s.workers = static_cast<int>(workers_.size() - exited_.size());
  s.open_connections = static_cast<int>(std::count_if(connections_.begin(), connections_.end(),
                                                      [](const auto& c) { return c != nullptr; }));
  return s;
}

}  // namespace shardcache::upstream
