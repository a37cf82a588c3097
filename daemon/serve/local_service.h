// LocalService: the trainer-facing service of a node daemon, on a Unix socket. It owns the
// socket, the accept loop, the peer access check, the registry of client connections, the
// reaper of what gone clients leave, Stop/Disconnect and the figures of Stats(); the rest is
// done by the units it wires together:
//   - local_session.h: one client connection (LocalSession) — the protocol, one handler per
//     request, the connection's arena and loaders, and their release when the client goes;
//   - loader_factory.h: OpenLoader's request checks, plan and locator sharing, ring and
//     prefault sizing (LoaderFactory);
//   - access_order_reporter.h: the node's future chunk order, told to options.observer
//     (AccessOrderReporter);
//   - warm_jobs.h: the warm jobs (WarmJobs).
//
// Protocol (proto/shardcache/local.proto, framed by proto/shardcache/local_wire.h): one
// LocalResponse per LocalRequest, in order (local_session.h).
//
// Access: on accept, the peer's credentials (SO_PEERCRED, SO_PEERGROUPS) are checked against the
// allowed uids and groups (peer_access.h) BEFORE anything else happens; a refused peer gets one
// LocalResponse with code PermissionDenied and the connection is closed — no file descriptor is
// ever sent to it. Beyond max_connections, a peer gets ResourceExhausted the same way.
//
// Data plane: Hello creates the connection's Arena (a sealed memfd, see arena.h); each
// OpenLoader starts a LoaderPipeline (loader_pipeline.h) that assembles batches, in the order of
// the loader's EpochPlan (daemon/plan), into free slots. When the client disconnects — cleanly,
// or by crashing (EOF / ECONNRESET) — its loaders are closed, its slots freed and its arena
// unmapped and closed, by the reaper thread (a loader may wait on the upstream for its reads in
// flight; the connection must go at once). Nothing is created in /dev/shm. Once the last client
// is gone and torn down, the heap the burst freed goes back to the kernel.
//
// Threads: one accept thread, one thread per connection (blocking reads; a node serves at most a
// few dozen trainers, and per-connection threads keep a slow or stuck client from delaying
// others without an event loop), one thread per open loader (loader_pipeline.h), the
// BatchAssembler's reader pool shared by all loaders (owned by the LoaderFactory), the reaper
// thread, and the access-order reporter's thread when there is an observer.
//
// Warm jobs (WarmDataset / WarmStatus, local protocol 2; warm_jobs.h): daemon-side jobs that
// read a whole dataset into the cache for `shardctl warm --socket`. They need no Hello and
// outlive the connection that asked; Stop() cancels and joins every job before the clients are
// disconnected.
//
// Stop ordering: Disconnect() stops accepting, stops the warm jobs, then shuts every client's
// socket down and cancels its loaders; Stop() then stops the reporter, joins the connections,
// and joins the reaper once it has torn down every retired loader and arena.
//
// Thread safety: Start(), Disconnect() and Stop() from one controlling thread; the counts,
// Stats() and the lookahead setter from any thread; the rest is internal. Lock order: mu_
// before a LocalSession's lock.
#pragma once

#include <cstdint>
#include <deque>
#include <list>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "common/fs.h"
#include "common/mutex.h"
#include "common/status.h"
#include "daemon/serve/access_order_reporter.h"
#include "daemon/serve/batch_assembler.h"
#include "daemon/serve/loader_factory.h"
#include "daemon/serve/local_session.h"
#include "daemon/serve/peer_access.h"
#include "daemon/serve/serve_defaults.h"
#include "daemon/serve/warm_jobs.h"
#include "daemon/source/chunk_source.h"

namespace shardcache::serve {

// kRingEntries, RingEntriesFor and kOpenPrefaultBytes: loader_factory.h; kMaxNextTimeoutMs:
// local_session.h.

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
  // Optional. See access_order_reporter.h for what is reported and when.
  AccessOrderObserver observer;
  // Delay that coalesces loader openings (the ranks of a job start together) into one report.
  // Default: 200 ms.
  uint32_t observer_delay_ms = 200;
  // Warm jobs running at the same time (over all datasets); a request beyond gets
  // ResourceExhausted. Default: 2.
  uint32_t max_warm_jobs = 2;
  // Checkpoint staging for CheckpointOpen & co (daemon/checkpoint/checkpoint_stage.h); null:
  // those requests are refused. Outlives the service.
  checkpoint::CheckpointStage* checkpoints = nullptr;
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
  void SetPrefetchLookaheadBytes(uint64_t bytes) { loaders_.SetPrefetchLookaheadBytes(bytes); }
  uint64_t prefetch_lookahead_bytes() const { return loaders_.prefetch_lookahead_bytes(); }
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
  void AcceptLoop();
  // Admits an accepted client whose credentials `peer` passed the access check, or refuses it
  // beyond max_connections.
  void Admit(UniqueFd fd, const PeerCredentials& peer);
  // Joins the threads of connections that ended. Once the last client is gone and its loaders
  // and arena are torn down, hands the heap the burst freed back to the kernel (the allocator keeps
  // freed buffers for reuse, see common/allocator.h, so without this an idle node keeps the
  // peak of its last job resident).
  void ReapFinished();
  // The loaders of clients that went away, with the arena they write into, are torn down by
  // the reaper thread, not the connection's: a loader waits for its reads in flight, which may
  // wait on the upstream until their deadline, and the connection (its thread, socket and
  // arena slots) must go at once.
  void Retire(RetiredSession r);
  void ReaperLoop();

  ChunkSource& source_;
  const LocalServiceOptions options_;
  const PeerAccess access_;
  AccessOrderReporter reporter_;  // before loaders_, which notes to it
  LoaderFactory loaders_;
  WarmJobs warm_jobs_;

  UniqueFd listen_fd_;
  UniqueFd stop_event_;  // eventfd that wakes the accept loop
  std::thread accept_thread_;
  bool started_ = false;       // Start/Disconnect/Stop run on one controlling thread
  bool disconnected_ = false;

  mutable Mutex mu_;
  std::list<std::unique_ptr<LocalSession>> connections_ GUARDED_BY(mu_);

  mutable Mutex retire_mu_;
  CondVar retire_cv_;
  std::deque<RetiredSession> retired_ GUARDED_BY(retire_mu_);
  bool reaper_stop_ GUARDED_BY(retire_mu_) = false;
  bool trim_pending_ = false;    // accept thread only: a connection ended since the last trim
  std::thread reaper_thread_;
};

}  // namespace shardcache::serve
