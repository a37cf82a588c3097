// GrpcSource: a ChunkSource that fetches from another shardcached's Origin service
// (upstream = "grpc://host:port" or "grpcs://host:port") — the node side of the long link.
//
// How it fills a long, high-latency link:
//   * Up to `max_connections` stream slots, each an independent HTTP/2 connection (one channel
//     each, kept apart with GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL plus a distinct channel
//     argument) with large fixed flow-control windows (64 MiB stream lookahead, 1 MiB frames).
//     One stream runs per connection at a time, so each stream gets a whole window.
//   * The number of concurrent streams starts at `connections` and hill-climbs on measured
//     goodput (StreamController); `max_connections` (256) is only a safety cap. Worker threads
//     and connections are made when the limit and the waiting work first need them, and
//     released after `idle_release` unused, so the pool costs nothing while the cache serves.
//     An upstream that refuses streams for want of capacity lowers the ceiling. A stream found
//     stuck (HedgeLoop's test: no message for longer than its kind usually takes) does not
//     count against the limit while the upstream is up: a stalled connection carries nothing,
//     so queued work runs beside it (within the slots). Measured at 1% stalls of 2 s (bench
//     cold, 11 alternating pairs): 0.77-0.83 x link (mean 0.795) against 0.70-0.83 (0.784);
//     25 runs of it in all: 0.68-0.85, mean 0.80 -- a small gain, inside the runs' spread.
//   * ReadChunks splits its range into sub-ranges of up to `chunks_per_stream` chunks, fetched
//     concurrently, and delivers chunks to the sink strictly in order. At most (limit + 1)
//     sub-ranges per call are outstanding ahead of the delivery point, and all calls together
//     hold at most `max_in_flight_bytes` of requested, undelivered chunks (each call may always
//     have one sub-range out, so the budget slows fetching but never stalls it).
//   * Demand before prefetch: a free stream slot always goes to waiting demand work first;
//     prefetch work starts only when no demand work waits. Demand work may also run on up to
//     kDemandLanes streams past the limit, so a batch's own reads (a cold epoch's first batch:
//     a few block ranges) never wait behind prefetch streams that hold every slot for whole
//     chunks.
//   * Parts: a whole chunk travels as messages of part_blocks blocks (1 MiB), so a stream's
//     progress shows every part, not only every chunk (an origin that predates parts sends the
//     chunk in one message; both are taken). The chunk is checked against its manifest root
//     once all parts are in.
//   * Hedging: a demand fetch (a batch's own read) that has had no message for 4x the usual
//     time of one message of its kind (block range or part; the median of the last 31, so a
//     few stalled messages do not raise it; at least 200 ms / 500 ms; no whole chunk is hedged
//     before one message of its kind has arrived: on a cold start they are all slow, none
//     stuck; before the attempt's first message, 4x the usual first answer at least: a round
//     trip and the link's queue, half a second behind 128 streams' windows) is re-issued on
//     another stream (another connection), unless the upstream is down. Both share the chunks'
//     leaders (ChunkLeaders): the first verified copy of each chunk is published, the other
//     dropped, and whichever finishes first ends the others. When the hedge is stuck as well
//     another follows, up to kMaxHedges. A stalled connection then costs a batch a fraction of
//     a second, not the stall. A whole chunk's hedge is block ranges on up to kStripes streams
//     (RunStriped) for the blocks the stalled stream has not brought yet; its parts so far are
//     taken as they are. A prefetch that a demand read waits for is hedged like a demand
//     fetch, and so is any stuck prefetch of block ranges (a prefetch batch's stream: its
//     ranges then run alone; not a whole chunk, whose copy costs its whole length) while
//     streams are spare — nothing queued and at most half the limit running, an
//     epoch's tail, where the last samples otherwise wait out their streams' stalls (traced:
//     the last 4% of a cold epoch took 3-4 s of 13 at 1% stalls of 2 s; 0.65 -> 0.87 x link).
//     Spare prefetches are judged by the same thresholds (a fixed 300 ms one at the tail was
//     tried and removed: a whole chunk alone on a narrow window takes a second by nature).
//     A task found stuck has its connection closed when it ends, not given to the next task:
//     the TCP connection stays stalled after its call is cancelled (traced: a range and its
//     three hedges all stuck on slots freed by cancelled stuck batches). Counted in
//     shardcache_upstream_hedges_total and shardcache_upstream_stalled_connections_total.
//     Opening a dataset's manifest starts connecting those slots, so that the reads
//     that follow an open do not each wait for a handshake.
//   * A global bandwidth cap (TokenBucket) shared by all streams; SetBandwidth changes it live.
//   * Single-flight per chunk: concurrent callers wanting the same (version, shard, chunk) share
//     one fetch (SingleFlight), so each chunk crosses the link once however many want it.
//
// Robustness: every call has a deadline (min(caller deadline, now + call_timeout)); a failed
// or broken stream is retried with jittered exponential backoff (reset by progress) and
// resumes at the first chunk not yet verified — so a connection that resets every few MiB
// still completes, and an upstream that comes back in time is used. Retries stop at the
// caller's deadline or when the upstream has not answered for `outage_timeout`
// (upstream_health.h), whichever comes first; then the result is Unavailable naming the
// upstream and the last error, and while such an outage goes on new calls fail at once.
// Non-retryable answers (InvalidArgument, NotFound, FailedPrecondition, Unauthenticated,
// PermissionDenied, DataLoss from the origin) fail at once. Unary calls (manifest, sample
// index, list) make up to 1 + max_retries attempts within call_timeout.
//
// Health: a prober thread asks the upstream a question it answers without reading anything
// (GetManifest of the empty name: InvalidArgument at once) when no call has answered for
// `probe_interval` (at most a third of outage_timeout), every second while it is down, and at
// once after a failed attempt, on a connection of its own; the outcome feeds UpstreamHealth
// (shardcache_upstream_up, /ready, /status).
//
// Block ranges (ReadPieces): the pieces a batch needs are fetched as ranges of 16 KiB blocks
// (common/hash.h) covering them, one range per run of pieces that share blocks, through the
// same stream slots, retries and controller as whole chunks (single-flight per range), launched
// in the order the caller gave the pieces; each piece is copied out (ReadOptions::piece_done) as
// its range lands. The first range of a chunk also brings the chunk's block table, checked
// against the manifest's Merkle root and remembered (BlockTables); every block is checked
// against the table before any byte of it is copied, and a block that fails is counted and
// refetched like a chunk. A demand read that joins a queued prefetch range moves it to the
// demand queue. A demand read that finds streams idle cuts its ranges into stripes of at
// least kMinStripeBlocks blocks on as many streams (at most kStripes a range): one stream
// carries a window per round trip (and a TCP connection idle for a while starts again from
// its initial window), so a batch's bytes spread over idle streams come in fewer rounds
// (traced on bench cold at 10 ms / 64 KiB windows: a cold epoch's first batch, 16 ranges of
// 64 KiB sample + 4 KiB block table, took two window rounds per stream; first batch 45 ms,
// 27 ms where one window held a range).
//
// Batched ranges (RunBatch): prefetch ranges queued one behind another ride on one stream
// together (origin.proto more_ranges; up to kBatchBytes), so a global shuffle's warm reads, a
// range per sample, cost a call per megabyte rather than per sample (measured on bench cold at
// 1 Gbit: a call per 64 KiB range held the node at 8 CPU-seconds per GiB and the link at 0.6).
// Each chunk's table is asked for once over all batches (BlockTables::Claim); a range whose
// table another stream brings goes last in its batch and waits for it. A range a batch did not
// bring (failed its check, the stream broke, an origin that predates more_ranges) runs again
// alone, as demand work when a read waits for it; a batch that goes quiet while a read waits
// for one of its ranges is ended by the hedger and its rest run alone.
//
// Integrity: every chunk is decoded (ChunkDecoder: bomb-safe) and checked against the hash in
// the manifest before it is delivered or shared; a mismatch is counted and refetched, and after
// `max_retries` mismatches of one chunk the result is DataLoss. Manifests are checked against
// their version (the version is the hash of the manifest bytes).
//
// Thread safety: safe for concurrent use from any number of threads. The sink runs on the
// calling thread.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <set>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "common/metrics.h"
#include "common/mutex.h"
#include "common/stats.h"
#include "daemon/source/chunk_key.h"
#include "daemon/source/chunk_source.h"
#include "daemon/upstream/block_tables.h"
#include "daemon/upstream/chunk_leaders.h"
#include "daemon/upstream/grpc_source_options.h"
#include "daemon/upstream/message_times.h"
#include "daemon/upstream/single_flight.h"
#include "daemon/upstream/stream_controller.h"
#include "daemon/upstream/token_bucket.h"
#include "daemon/upstream/upstream_health.h"

namespace grpc {
class Channel;
class ChannelCredentials;
class ClientContext;
class Status;
}

namespace shardcache::v1 {
class ChunkMessage;
}

namespace shardcache::upstream {

struct UpstreamGauges;

// A gRPC call's status as ours (the codes are the same numbers).
Status FromGrpcStatus(const grpc::Status& s);
// Codes of an upstream call worth another attempt: the link or the upstream's load, not the
// request. DataLoss from the upstream is final: it verified its own copy and that is corrupt
// (our own mismatches are handled apart).
bool Retryable(StatusCode c);

struct PartialChunk;  // grpc_source.cc: a whole chunk arriving in parts

class GrpcSource final : public ChunkSource, public stats::Source {
 public:
  // Streams demand work may run past the stream limit (see above): a batch of 16 samples in 16
  // chunks starts at once.
  static constexpr int kDemandLanes = 16;
  // Copies of one stuck fetch racing it at most: a second (third) hedge starts only when the
  // one before is stuck as well, so one stall behind another costs a few look periods, not a
  // stall.
  static constexpr size_t kMaxHedges = 3;
  // Block ranges a whole chunk's hedge is split into (RunStriped), and a demand range at most
  // (FetchStriped).
  static constexpr uint64_t kStripes = 8;
  // Fewest blocks in a demand range's stripe: each stripe of a chunk whose block table is not
  // known yet brings the table (4 KiB for 4 MiB), so stripes of 32 KiB cost at most an eighth.
  static constexpr uint64_t kMinStripeBlocks = 2;
  // Prefetch block ranges queued together ride on one stream (RunBatch), up to this many bytes
  // and ranges: a global shuffle's warm reads are ranges of a sample each, and a call per
  // range cost more CPU than the link could carry on a small node.
  static constexpr uint64_t kBatchBytes = 1ull << 20;
  static constexpr size_t kBatchRanges = 64;
  // How long a batched range waits for its chunk's table from another stream, and how long a
  // claim to ask for a table lasts (BlockTables::Claim).
  static constexpr std::chrono::milliseconds kTableWait{1000};

  // Reads the certificate files; InvalidArgument / NotFound naming a bad option or file.
  // Does not connect: connections are made on first use.
  static Result<std::unique_ptr<GrpcSource>> Create(GrpcSourceOptions options);
  ~GrpcSource() override;

  Result<std::vector<v1::DatasetSummary>> ListDatasets() override;
  Result<DatasetPtr> OpenDataset(const std::string& name) override;
  Result<std::string> GetSampleIndex(const DatasetPtr& dataset, uint32_t shard) override;
  Status ReadChunks(const DatasetPtr& dataset, uint32_t shard, uint64_t first, uint64_t count,
                    const ReadOptions& options, const ChunkSink& sink) override;
  // Fetches only the blocks covering the pieces (see above); nothing is kept but block tables.
  Status ReadPieces(const DatasetPtr& dataset, uint32_t shard, std::span<const ChunkPiece> pieces,
                    const ReadOptions& options) override;
  bool FetchesBlockRanges() override { return true; }
  bool BatchesBlockRanges() override { return true; }
  // Marks the chunk's flight wanted (HedgeLoop hedges its fetch when stuck) and moves a queued
  // prefetch of it to the demand queue.
  void Expedite(const ChunkKey& key) override;
  // Cancels the streams and unary calls in flight, drops queued fetches (their waiters get
  // Aborted) and refuses new ones; the workers exit.
  void Shutdown() override;

  void SetBandwidth(uint64_t bytes_per_s) { bucket_.SetRate(bytes_per_s); }
  // Whether the upstream answers, and since when not (upstream_health.h).
  UpstreamHealth::Snapshot health() const { return health_.Get(); }

  // A connection of its own to this upstream (same TLS and channel arguments), for calls that
  // are not chunk reads — checkpoint uploads; `index` tells such connections apart.
  std::shared_ptr<grpc::Channel> NewCallChannel(int index) const;
  // Adds the bearer token (if any) to a call.
  void AddAuth(grpc::ClientContext* ctx) const;
  // "upstream host:port", for messages.
  std::string Where() const;

  // Counters of this instance (the process-wide ones are in metrics::Registry::Global()).
  struct Stats {
    uint64_t wire_bytes = 0;         // payload bytes as received (compressed or raw)
    uint64_t payload_bytes = 0;      // verified chunk bytes after decoding
    uint64_t chunks = 0;             // chunks fetched and verified
    uint64_t block_ranges = 0;       // block ranges fetched and verified (ReadPieces)
    uint64_t streams = 0;            // ReadChunks calls opened upstream
    uint64_t retries = 0;            // attempts after a failure
    uint64_t checksum_failures = 0;  // chunks that failed verification (refetched)
    uint64_t hedges = 0;             // stuck demand fetches re-issued on another stream
    uint64_t range_hedges = 0;       // of them, block ranges
    uint64_t stalled_connections = 0;  // closed after a stream on them was found stuck
    uint64_t striped_ranges = 0;     // block ranges of a demand read cut into stripes
    int stream_limit = 0;            // current adaptive limit
    double goodput_bytes_per_s = 0;  // last measured
    int workers = 0;                 // worker threads alive
    int open_connections = 0;        // stream slots with a channel
    uint64_t in_flight_bytes = 0;    // requested chunk bytes not yet delivered
  };
  Stats stats() const;
  // The counters of stats(), for /metrics (shardcache_upstream_*_total).
  void VisitStats(const stats::Visitor& visit) const override;

 private:
  struct Connection;
  struct FetchTask;
  using ChunkResult = Result<ChunkPtr>;
  using Flights = ChunkLeaders::Flights;

  explicit GrpcSource(GrpcSourceOptions options);
  // A channel to the upstream with its own TCP connection (`index` keeps channels apart).
  std::shared_ptr<grpc::Channel> NewChannel(int index) const;
  void Submit(std::shared_ptr<FetchTask> task);
  // Starts worker threads while queued work outnumbers the idle workers and the limit allows;
  // joins workers that exited.
  void SpawnWorkers() REQUIRES(mu_);
  // Streams that may run while demand work waits: the limit plus kDemandLanes (within the slots).
  int DemandLimit() const REQUIRES(mu_);
  // Streams that may run: the controller's limit plus the stuck ones (within the slots).
  int StreamLimit() const REQUIRES(mu_);
  // Re-issues stuck demand fetches on another stream (see above); runs while the source lives.
  void HedgeLoop();
  // Re-issues stuck task `t` on another stream (HedgeLoop's decision; `usual`: its kind's usual
  // message time, for the log).
  void StartHedge(const std::shared_ptr<FetchTask>& t, int64_t now, int64_t usual) REQUIRES(mu_);
  // How long a running task may go without a message before it is hedged, for a block range
  // (`range`) or a whole chunk's part, given the usual time of its kind (`usual`, 0: none yet).
  static std::chrono::nanoseconds StuckAfter(bool range, int64_t usual);
  // Starts connecting the slots a first batch's reads would take (DemandLimit of them) that
  // have no connection yet, in the background; idle ones close after idle_release as always.
  void PreConnect();
  // Takes out the channels of free slots unused for idle_release (destroy them unlocked).
  std::vector<std::unique_ptr<Connection>> TakeIdleConnections(std::chrono::steady_clock::time_point now)
      REQUIRES(mu_);
  // Reserves `bytes` of the in-flight budget; `force` (the caller has nothing outstanding)
  // reserves past it.
  bool ReserveInFlight(uint64_t bytes, bool force);
  void ReleaseInFlight(uint64_t bytes);
  // Starts fetches for chunks [from, to) of a ReadChunks call: chunks nobody fetches yet become
  // its own tasks (`mine`, grouped into contiguous runs); chunks already in flight are waited
  // for. Their handles go to the front of `pending` (in order) or to its back.
  void Launch(const DatasetPtr& d, uint32_t shard, uint64_t from, uint64_t to, const ReadOptions& options,
              bool front, std::deque<Flights::Flight>* pending, std::vector<std::shared_ptr<FetchTask>>* mine);
  void WorkerLoop(uint64_t id);
  // A worker's task is done and its slot free (under mu_).
  void TaskEnded() REQUIRES(mu_);
  // Probes the upstream when health_ says one is due (see above), until shutdown.
  void ProbeLoop();
  struct TaskProgress;
  struct Attempt;
  // Fetches the task's chunks, retrying with backoff, until each is published (data or error).
  void RunTask(FetchTask& task, Connection& conn);
  // An attempt of `tasks` (those riding on one stream) begins; none has been heard since.
  Attempt BeginAttempt(std::span<FetchTask* const> tasks);
  // A message arrived on the attempt's stream: its time (the first one's also as a first
  // answer), every task on the stream heard now, the upstream up.
  void Heard(Attempt& a, std::span<FetchTask* const> tasks);
  // One ReadChunks stream for the task's chunks from p.next.
  Attempt Stream(FetchTask& task, Connection& conn, grpc::ClientContext& ctx, TaskProgress& p);
  // The request of the task's next attempt (from p.next; a block range asks for the chunk's
  // table when p.table, looked up here, is not known).
  v1::ReadChunksRequest RequestFor(const FetchTask& task, TaskProgress& p);
  // Prefetch block ranges that may ride on one stream together (Batchable), queued behind
  // `first` in prefetch_, up to kBatchBytes and kBatchRanges in all; taken out of the queue.
  static bool Batchable(const FetchTask& t);
  std::vector<std::shared_ptr<FetchTask>> TakeCompanions(const FetchTask& first) REQUIRES(mu_);
  // One attempt at `first` and its companions as one stream (origin.proto: more_ranges);
  // companions it did not bring are queued again to run alone (as demand work when a read
  // waits for them), and `first` goes on with RunTask.
  void RunBatch(FetchTask& first, std::vector<std::shared_ptr<FetchTask>>& companions, Connection& conn);
  // The stream of RunBatch (the ranges whose chunk table another stream brings go last); returns
  // how many of `tasks` it brought.
  size_t StreamBatch(const std::vector<FetchTask*>& tasks, Connection& conn, grpc::ClientContext& ctx);
  // A demand read joined the flight of a block range that a queued prefetch task leads: it
  // moves to the demand queue.
  void ExpediteRange(const DatasetPtr& d, uint32_t shard, uint64_t chunk, uint32_t first_block, uint32_t block_count);
  // Moves the first queued prefetch task that `match`es to the demand queue (Expedite,
  // ExpediteRange); nothing when none does.
  void PromoteToDemand(const std::function<bool(const FetchTask&)>& match);
  // Verifies and publishes one message's chunk; false when the stream must be left.
  bool Receive(FetchTask& task, const v1::ChunkMessage& msg, TaskProgress& p, Attempt& a);
  // A whole chunk's bytes against the manifest's root for chunk `index`; sets chunk.hash.
  static Status VerifyRoot(const FetchTask& task, uint64_t index, Chunk& chunk, const std::string& where);
  // A whole chunk's message (all of it, or its next part): decoded into `partial` (the task's,
  // which its hedge reads), and into `out` with *whole set once the chunk is complete. DataLoss
  // for a part that does not fit the chunk.
  static Status TakePart(const v1::ChunkMessage& msg, uint64_t len, const std::string& where, TaskProgress& p,
                         PartialChunk& partial, AlignedBuffer* out, bool* whole);
  // Checks a block range's bytes against the block table that came with it (itself checked
  // against the manifest, then remembered) or the one remembered; DataLoss naming the block.
  Status VerifyRange(const FetchTask& task, const v1::ChunkMessage& msg, const TaskProgress& p,
                     const Chunk& range, const std::string& where);
  // Blocks [b0, b1) of `chunk`, holding pieces [first_piece, end_piece) of a read's sorted pieces.
  struct PieceRange {
    uint64_t chunk;
    uint64_t b0, b1;
    size_t first_piece, end_piece;
    Flights::Flight flight;
  };
  // Fetches `ranges` as block-range flights (joining ones in flight) and copies each into its
  // pieces (`order`) as it lands, telling ReadOptions::piece_done; the first failure cancels
  // what this call started and is returned.
  // `given` is the caller's first piece (for ReadOptions::piece_done's indexes).
  Status FetchRanges(const DatasetPtr& d, uint32_t shard, const ChunkPiece* given,
                     const std::vector<const ChunkPiece*>& order, std::vector<PieceRange>& ranges,
                     const ReadOptions& options);
  // Stripes per range for a demand read of `ranges` ranges: the idle demand streams shared
  // out (at most kStripes; 1 when there are too few to go round twice).
  uint64_t DemandStripes(size_t ranges);
  // Fetches `ranges` (as FetchRanges) each cut into up to `stripes` ranges of at least
  // kMinStripeBlocks blocks, the pieces spanning a cut cut with them; the caller's piece_done
  // is told of a piece once all its parts are in.
  Status FetchStriped(const DatasetPtr& d, uint32_t shard, std::span<const ChunkPiece> given,
                      const std::vector<const ChunkPiece*>& order, std::vector<PieceRange>& ranges,
                      uint64_t stripes, const ReadOptions& options);
  // A striped hedge: the task's next open chunk as kStripes demand block ranges, assembled,
  // checked against the manifest hash and published (a failure is left to the original).
  void RunStriped(FetchTask& task);
  // Starts (or joins) the fetch of blocks [first_block, first_block + block_count) of a chunk.
  Flights::Flight LaunchRange(const DatasetPtr& d, uint32_t shard, uint64_t chunk, uint32_t first_block,
                              uint32_t block_count, const ReadOptions& options,
                              std::vector<std::shared_ptr<FetchTask>>* mine);
  // After a failed attempt: fails the rest or sleeps the backoff; false when the task is over.
  // An attempt a hedge ended by bringing the rest is no failure: true at once, nothing counted.
  bool BackOffAfter(FetchTask& task, const Attempt& a, TaskProgress& p);
  // Publishes `s` to every chunk not yet published.
  void FailRest(FetchTask& task, TaskProgress& p, const Status& s);
  // Feeds the adaptive controller after a chunk of `chunk_bytes` arrived `chunk_time` after
  // its stream asked for it (or after the chunk before it); wakes or starts workers when the
  // limit changed.
  void ObserveProgress(uint64_t chunk_bytes, std::chrono::nanoseconds chunk_time);
  // Sleeps until `t`; false when the source is shutting down.
  bool SleepUntil(std::chrono::steady_clock::time_point t);
  // GetManifest of `name`, remembered in manifests_; `stale` (the last one known, may be null)
  // when the upstream cannot be reached.
  Result<DatasetPtr> FetchManifest(const std::string& name, const DatasetPtr& stale);
  // Runs a unary call on the control connection with a deadline of call_timeout and retries.
  template <typename Call>
  Status UnaryWithRetries(const std::string& what, Call&& call);

  const GrpcSourceOptions options_;
  std::shared_ptr<grpc::ChannelCredentials> creds_;  // constant after construction
  std::unique_ptr<Connection> control_;              // unary calls; constant after construction
  TokenBucket bucket_;
  StreamController controller_;
  Flights flights_;
  Flights range_flights_;  // block ranges, keyed by RangeKey (grpc_source.cc)
  BlockTables tables_;
  UpstreamHealth health_;
  const UpstreamGauges& m_;  // the scheduler's gauges (or unreported ones)

  // Scheduler: FetchTasks wait here for a stream slot (= connection).
  mutable Mutex mu_;
  CondVar cv_;       // the hedger and backoff sleeps
  CondVar work_cv_;  // idle workers (one woken per task or free slot: hundreds may wait)
  std::deque<std::shared_ptr<FetchTask>> demand_ GUARDED_BY(mu_);
  std::deque<std::shared_ptr<FetchTask>> prefetch_ GUARDED_BY(mu_);
  // Per slot (max_connections of them): its connection (null until first used, and again
  // after idle_release unused; a busy slot's connection is used by its worker unlocked and
  // stays until the slot is free), whether a worker holds it, its task, when it was last used.
  std::vector<std::unique_ptr<Connection>> connections_ GUARDED_BY(mu_);
  std::vector<bool> slot_busy_ GUARDED_BY(mu_);
  std::vector<std::shared_ptr<FetchTask>> running_conn_ GUARDED_BY(mu_);
  std::vector<std::chrono::steady_clock::time_point> slot_used_ GUARDED_BY(mu_);
  int running_ GUARDED_BY(mu_) = 0;
  // Running tasks HedgeLoop found stuck at its last look (while the upstream is up): a stalled
  // connection carries nothing, so it does not count against the stream limit (StreamLimit).
  int stuck_ GUARDED_BY(mu_) = 0;
  // Worker threads by id; the ids of those that exited (joined by the next SpawnWorkers).
  std::map<uint64_t, std::thread> workers_ GUARDED_BY(mu_);
  std::vector<uint64_t> exited_ GUARDED_BY(mu_);
  uint64_t next_worker_id_ GUARDED_BY(mu_) = 0;
  std::atomic<uint64_t> in_flight_bytes_{0};
  std::atomic<int> running_now_{0};  // running_, for the controller's reports
  std::atomic<bool> waited_{false};  // work waited for a slot since the controller last looked
  bool stopping_ GUARDED_BY(mu_) = false;
  std::set<grpc::ClientContext*> unary_ GUARDED_BY(mu_);      // unary calls in flight
  CondVar probe_cv_;                                          // a failure wants a probe now, or stop
  grpc::ClientContext* probe_ctx_ GUARDED_BY(mu_) = nullptr;  // the probe in flight
  std::thread prober_;
  std::thread hedger_;  // HedgeLoop
  // One message's usual time on its stream: parts of whole chunks (or whole chunks, from an
  // upstream that sends no parts), block ranges; and of an attempt's first message (a round
  // trip and the link's queue).
  MessageTimes chunk_times_, range_times_, first_times_;

  Mutex manifest_mu_;
  struct CachedManifest {
    DatasetPtr dataset;
    std::chrono::steady_clock::time_point fetched;
  };
  std::map<std::string, CachedManifest> manifests_ GUARDED_BY(manifest_mu_);
  SingleFlight<std::string, Result<DatasetPtr>> manifest_flights_;  // per dataset name

  std::atomic<uint64_t> wire_bytes_{0}, payload_bytes_{0}, chunks_{0}, block_ranges_{0}, streams_{0}, retries_{0},
      checksum_failures_{0}, hedges_{0}, range_hedges_{0}, stalled_connections_{0}, striped_ranges_{0},
      block_tables_{0};
  metrics::SourceHandle stats_source_;  // reset first thing in the destructor
};

}  // namespace shardcache::upstream
