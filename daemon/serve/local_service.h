// LocalService: the trainer-facing service of a node daemon, on a Unix socket.
//
// Protocol (proto/shardcache/local.proto, framed by proto/shardcache/local_wire.h): one
// LocalResponse per LocalRequest, in order. A frame above local_wire::kMaxFrameBytes, a
// malformed message or an unknown request closes the connection with a log line.
//
// Access: on accept, the peer's credentials (SO_PEERCRED, SO_PEERGROUPS) are checked against the
// allowed uids and groups (peer_access.h) BEFORE anything else happens; a refused peer gets one
// LocalResponse with code PermissionDenied and the connection is closed — no file descriptor is
// ever sent to it.
//
// Data plane: Hello creates the connection's Arena (a sealed memfd, see arena.h) and sends its
// descriptor with SCM_RIGHTS. Each OpenLoader starts a LoaderPipeline (loader_pipeline.h) that
// assembles batches, in the order of the loader's EpochPlan (daemon/plan), into free slots.
// When the client disconnects — cleanly, or by crashing (EOF / ECONNRESET) — its loaders are
// closed, its slots freed and its arena unmapped and closed; the kernel frees the memory when
// the client's own mapping goes. Nothing is created in /dev/shm.
//
// Threads: one accept thread, one thread per connection (blocking reads; a node serves at most a
// few dozen trainers, and per-connection threads keep a slow or stuck client from delaying
// others without an event loop), one thread per open loader (loader_pipeline.h), and the
// BatchAssembler's reader pool shared by all loaders.
//
// Sharing: loaders with equal plan parameters (dataset version, seed, epoch, mode, window) share
// one EpochPlan, whatever their world size, batch size or worker, and loaders of one dataset version share
// one SampleLocator. Chunk reads go to the ChunkSource, whose cache tier single-flights them, so
// the ranks of one job on one node fetch each chunk once.
//
// Future order: the plan fixes what every loader reads next, so the service tells the cache.
// Ranks of one job are strided over the job's global order (daemon/plan), so the node's reads
// for a job follow the global order restricted to the ranks open on this node. For each plan
// in use, a background thread reports (to options.observer) the chunk order of the rest of
// the epoch from the earliest local loader's position, followed by the whole next epoch
// (epoch + 1, same parameters), consecutive repeats collapsed. Reports are coalesced over
// observer_delay_ms and repeated when another rank of the same plan opens. The daemon wires it
// to CachedSource::SetFutureAccessOrder(version, access_plan().Now(version), order).
//
// Warm jobs (WarmDataset / WarmStatus, local protocol 2; warm_jobs.h): daemon-side jobs that
// read a whole dataset into the cache for `shardctl warm --socket`. They need no Hello and
// outlive the connection that asked; Stop() cancels and joins every job before the clients are
// disconnected.
//
// Thread safety: Start() and Stop() from one controlling thread; the rest is internal.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <deque>
#include <list>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "common/fs.h"
#include "common/mutex.h"
#include "common/status.h"
#include "daemon/plan/epoch_plan.h"
#include "daemon/serve/batch_assembler.h"
#include "daemon/serve/peer_access.h"
#include "daemon/serve/serve_defaults.h"
#include "daemon/serve/loader_pipeline.h"
#include "daemon/serve/warm_jobs.h"
#include "daemon/source/chunk_source.h"

namespace shardcache::v1 {
class HelloResponse;
class LocalRequest;
class LocalResponse;
class NextBatchRequest;
class NextBatchResponse;
class OpenLoaderRequest;
class OpenLoaderResponse;
class WarmDatasetResponse;
class WarmStatusResponse;
}  // namespace shardcache::v1

namespace shardcache::serve {

// Batches a loader's batch ring describes at once, at most half the arena's slots (the rest
// stay for the pipeline's prefetch_batches and the client's other loaders). The batches the
// client has read ahead, holds, or released without telling the daemon yet all count against
// it. The deeper the ring, the longer a daemon thread may be late (descheduled, a page fault,
// a slow read) before the trainer notices: 64 batches of a few hundred microseconds each ride
// out a 10-20 ms hiccup, 12 did not (bench/run latency on a 2-core VM).
constexpr uint32_t kRingEntries = 64;
// Ring entries for a loader that may hold max_slots slots: min(kRingEntries, max_slots), fewer
// when batches of batch_size samples would make the ring larger than batch_ring::kMaxRingBytes;
// at least 1.
uint32_t RingEntriesFor(uint32_t max_slots, uint32_t batch_size);
// OpenLoader faults in the front of every arena slot that the loader's batches fill (see
// Arena::PrefaultFronts), up to this much of the arena in all.
constexpr uint64_t kOpenPrefaultBytes = 256ull << 20;
// Longest a NextBatch may wait for its batch, whatever timeout the client asks for.
constexpr uint32_t kMaxNextTimeoutMs = 10 * 60 * 1000;

struct LocalServiceOptions {
  // Unix socket path; its directory is created. A stale socket (nobody accepting) is removed;
  // a live one is an error. Default: /run/shardcache/shardcached.sock.
  std::string socket_path = kDefaultSocketPath;
  // Permission bits of the socket file. Access control is SO_PEERCRED below, so the socket is
  // connectable by anyone by default and refused peers get a clear PermissionDenied.
  // Default: 0666.
  uint32_t socket_mode = 0666;
  // Peers allowed to connect: root and the daemon's own effective uid (unless
  // allow_root_and_self is false), plus any peer whose uid is in allowed_uids or any of whose
  // groups, primary or supplementary, is in allowed_gids or named in allowed_groups (resolved
  // when the service is constructed; see peer_access.h).
  std::vector<uint32_t> allowed_uids;
  std::vector<uint32_t> allowed_gids;
  std::vector<std::string> allowed_groups;
  // Default: true. False leaves exactly the lists above (tests use it to refuse root).
  bool allow_root_and_self = true;
  // Shared-memory arena per client connection, split into slot_count equal slots; one batch
  // fits in one slot. Default: 512 MiB in 16 slots (32 MiB per batch).
  uint64_t arena_bytes = kDefaultArenaBytes;
  uint32_t slot_count = kDefaultSlots;
  // Per loader: batches assembled ahead (default 4; each holds a slot while it waits, and the
  // loader's batch ring holds up to RingEntriesFor(slot_count / 2, batch_size) more; a ring
  // loader holds at most half the slots) and chunk bytes warmed ahead of
  // those (default 256 MiB; 0 = none, e.g. when there is no cache tier to warm).
  uint32_t prefetch_batches = 4;
  uint64_t prefetch_lookahead_bytes = kDefaultLookaheadBytes;
  // How long NextBatch waits for data when the client gives no timeout. Default: 120 s.
  uint32_t next_timeout_ms = 120000;
  // Connections beyond this are refused with ResourceExhausted. Default: 256.
  uint32_t max_connections = kDefaultMaxConnections;
  BatchAssemblerOptions assembler;
  // Receives the node's future chunk order per dataset, for the cache's clairvoyant policy.
  // Optional. See "Future order" above for what is reported and when.
  AccessOrderObserver observer;
  // Delay that coalesces loader openings (the ranks of a job start together) into one report.
  // Default: 200 ms.
  uint32_t observer_delay_ms = 200;
  // Warm jobs running at the same time (over all datasets); a request beyond gets
  // ResourceExhausted. Default: 2.
  uint32_t max_warm_jobs = 2;
  // Range size, parallelism and per-range deadline of each warm job (warm_job.h).
  WarmJobOptions warm;
};

class LocalService {
 public:
  LocalService(ChunkSource& source, LocalServiceOptions options);
  ~LocalService();  // Stop()
  LocalService(const LocalService&) = delete;
  LocalService& operator=(const LocalService&) = delete;

  // Creates the socket directory, removes a stale socket, binds, listens and starts accepting.
  // FailedPrecondition when another process serves the path or it is not a socket;
  // InvalidArgument for a path too long for sockaddr_un.
  Status Start();
  // Stops accepting and shuts every client's socket down, so that clients see the daemon go
  // at once (and reconnect to its successor) while loaders still finish; idempotent. Stop()
  // does it first: calling it earlier lets the daemon cancel what loaders wait on (its
  // upstream) without clients receiving the errors that causes.
  void Disconnect();
  // Disconnect(), then waits for every connection and loader to end and removes the socket.
  void Stop();

  const LocalServiceOptions& options() const { return options_; }
  // Changes the warm-read lookahead of every loader, open or future (SIGHUP reload).
  void SetPrefetchLookaheadBytes(uint64_t bytes) { lookahead_bytes_.store(bytes); }
  uint64_t prefetch_lookahead_bytes() const { return lookahead_bytes_.load(); }
  // Live connections / open loaders (also those of gone clients not yet torn down) / arena
  // slots in use, over all clients.
  size_t connection_count() const;
  size_t loader_count() const;
  uint32_t slots_in_use() const;
  // One JSON object with the figures above, the serve counters and the running warm jobs:
  // `clients` in /status (the daemon adds it as it is) and the answer to a Stats request.
  nlohmann::json Stats() const;
  std::string StatsJson() const;  // Stats(), serialized
  // Warm jobs still running.
  size_t running_warm_jobs() const { return warm_jobs_.running(); }

 private:
  struct Connection;
  void AcceptLoop();
  // A connection's thread: reads requests, answers each, and tears the connection down.
  void Serve(Connection* c);
  enum class Reply { kSend, kNone, kClose };
  // Handles one request of client `who` into *resp (an error included); *pass_fd gets a
  // descriptor to pass with the answer. kNone: the request wants no answer; kClose: end the
  // connection.
  Reply Handle(Connection* c, const std::string& who, const v1::LocalRequest& req, v1::LocalResponse* resp,
               int* pass_fd);
  // Hello: checks the protocol version and creates the connection's arena (its fd to pass).
  Status Hello(Connection* c, uint32_t version, v1::HelloResponse* h, int* pass_fd);
  // NextBatch: waits (bounded, and not past the client leaving) for a ring entry or a batch.
  Status NextBatch(Connection* c, const v1::NextBatchRequest& req, v1::NextBatchResponse* r);
  Status ReleaseBatch(Connection* c, uint64_t loader_id, uint32_t slot);
  Status CloseLoader(Connection* c, uint64_t loader_id);
  // After the last request: hands the connection's loaders and arena to the reaper.
  void Disconnected(Connection* c);
  Result<std::shared_ptr<SampleLocator>> LocatorFor(const DatasetPtr& dataset);
  Result<std::shared_ptr<const plan::EpochPlan>> PlanFor(const DatasetPtr& dataset,
                                                         const plan::PlanOptions& o);
  // Joins the threads of connections that ended. Once the last client is gone and its loaders
  // and arena are torn down, hands the heap the burst freed back to the kernel (the daemon keeps
  // large buffers in its heap, see common/malloc_tuning.h, so without this an idle node keeps
  // the peak of its last job resident).
  void ReapFinished();
  // Registers a loader's plan use for the access-order report.
  void NoteLoaderForObserver(const DatasetPtr& dataset, const std::shared_ptr<SampleLocator>& locator,
                             const plan::RankSlice& slice);
  // OpenLoader: validates the request (loader_request.h), builds or shares the plan, starts the
  // loader's pipeline and fills the response; *pass_fd gets the batch ring's descriptor.
  Status OpenLoader(Connection* c, const v1::OpenLoaderRequest& request, v1::OpenLoaderResponse* response,
                    int* pass_fd);
  void ObserverLoop();
  // WarmDataset: the running job for the dataset, or a new one.
  Status StartWarm(const std::string& dataset, v1::WarmDatasetResponse* response);
  static std::string PlanKey(const DatasetPtr& dataset, const plan::PlanOptions& o);

  ChunkSource& source_;
  const LocalServiceOptions options_;
  const PeerAccess access_;
  BatchAssembler assembler_;
  std::atomic<uint64_t> next_loader_id_{1};
  std::atomic<uint64_t> lookahead_bytes_;

  UniqueFd listen_fd_;
  UniqueFd stop_event_;  // eventfd that wakes the accept loop
  std::thread accept_thread_;
  bool started_ = false;       // Start/Disconnect/Stop run on one controlling thread
  bool disconnected_ = false;

  mutable Mutex mu_;
  std::list<std::unique_ptr<Connection>> connections_ GUARDED_BY(mu_);
  bool stopping_ GUARDED_BY(mu_) = false;
  std::map<std::string, std::weak_ptr<SampleLocator>> locators_ GUARDED_BY(mu_);
  std::map<std::string, std::weak_ptr<const plan::EpochPlan>> plans_ GUARDED_BY(mu_);

  // Access-order reports, by plan key.
  struct PlanUse {
    DatasetPtr dataset;
    std::weak_ptr<SampleLocator> locator;
    std::weak_ptr<const plan::EpochPlan> plan;
    uint32_t world_size = 1;
    uint64_t start_position = 0;
    std::map<uint32_t, uint64_t> rank_start;  // local rank → earliest rank start seen
    bool dirty = false;
  };
  Mutex observer_mu_;
  CondVar observer_cv_;
  std::map<std::string, PlanUse> plan_uses_ GUARDED_BY(observer_mu_);
  bool observer_stop_ GUARDED_BY(observer_mu_) = false;
  std::thread observer_thread_;

  // The loaders of clients that went away, with the arena they write into, are torn down by
  // the reaper thread, not the connection's: a loader waits for its reads in flight, which may
  // wait on the upstream until their deadline, and the connection (its thread, socket and
  // arena slots) must go at once.
  struct Retired {
    std::map<uint64_t, std::unique_ptr<LoaderPipeline>> loaders;
    std::unique_ptr<Arena> arena;
  };
  void Retire(Retired r);
  void ReaperLoop();
  mutable Mutex retire_mu_;
  CondVar retire_cv_;
  std::deque<Retired> retired_ GUARDED_BY(retire_mu_);
  bool reaper_stop_ GUARDED_BY(retire_mu_) = false;
  bool trim_pending_ = false;    // accept thread only: a connection ended since the last trim
  std::thread reaper_thread_;

  WarmJobs warm_jobs_;
};

}  // namespace shardcache::serve
