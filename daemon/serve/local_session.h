// LocalSession: one client connection of the local service, from its accept to its end.
//
// The session's thread reads the client's requests (proto/shardcache/local.proto, framed by
// proto/shardcache/local_wire.h) and answers each, in order, with one handler per request: one
// LocalResponse per LocalRequest. A frame above local_wire::kMaxFrameBytes, a malformed
// message or an unknown request ends the session with a log line.
//
// Data plane: Hello creates the session's Arena (a sealed memfd, see arena.h) and sends its
// descriptor with SCM_RIGHTS. Each OpenLoader starts a LoaderPipeline through the LoaderFactory
// (loader_factory.h), which assembles batches in plan order into free slots. When the client
// disconnects — cleanly, or by crashing (EOF / ECONNRESET) — its loaders are cancelled and,
// with the arena they write into, handed to the service's reaper (SessionServices::retire): a
// loader waits for its reads in flight, which may wait on the upstream until their deadline,
// and the session (its thread, socket and arena slots) must go at once. The kernel frees the
// arena's memory when the client's own mapping goes. Nothing is created in /dev/shm.
//
// Warm jobs (WarmDataset / WarmStatus) go to the service's WarmJobs; they need no Hello.
//
// Thread safety: Start() and Join() from the service's accept (or controlling) thread; the
// handlers run on the session's thread, which alone changes the arena, the loaders and the
// socket. Shutdown(), done(), loader_count() and slots_in_use() may be called from any thread:
// they read the arena and the loaders under mu_, which the session's thread holds when it
// changes them (it reads them without it), and the socket is closed under mu_ so that Shutdown()
// never shuts down a number that already names another file.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include "common/fs.h"
#include "common/mutex.h"
#include "common/status.h"
#include "daemon/serve/arena.h"
#include "daemon/serve/local_checkpoints.h"
#include "daemon/serve/loader_factory.h"
#include "daemon/serve/loader_pipeline.h"
#include "daemon/serve/peer_access.h"
#include "daemon/serve/warm_jobs.h"
#include "daemon/source/chunk_source.h"

namespace shardcache::v1 {
class HelloResponse;
class LocalRequest;
class LocalResponse;
class LoaderStateResponse;
class NextBatchRequest;
class NextBatchResponse;
class OpenLoaderRequest;
class OpenLoaderResponse;
class WarmDatasetResponse;
}  // namespace shardcache::v1

namespace shardcache::serve {

// Longest a NextBatch may wait for its batch, whatever timeout the client asks for.
constexpr uint32_t kMaxNextTimeoutMs = 10 * 60 * 1000;

// Sends one LocalResponse frame on `fd`, with descriptor `pass_fd` (-1: none) as SCM_RIGHTS.
Status SendLocalResponse(int fd, const v1::LocalResponse& r, int pass_fd = -1);
// Makes *r the error answer `s`.
void SetLocalError(v1::LocalResponse* r, const Status& s);

// What a session leaves behind when its client goes: its loaders (cancelled) and the arena they
// write into, to be torn down loaders first.
struct RetiredSession {
  std::map<uint64_t, std::unique_ptr<LoaderPipeline>> loaders;
  std::unique_ptr<Arena> arena;
};

struct LocalSessionOptions {
  // The arena Hello creates (see LocalServiceOptions).
  uint64_t arena_bytes = 0;
  uint32_t slot_count = 0;
  // How long NextBatch waits when the client gives no timeout.
  uint32_t next_timeout_ms = 120000;
};

// What a session uses of the service that accepted it; everything outlives the session.
struct SessionServices {
  LoaderFactory* loaders = nullptr;
  WarmJobs* warm_jobs = nullptr;
  ChunkSource* source = nullptr;  // opens the dataset a WarmDataset names
  std::function<std::string()> stats_json;      // the answer to a Stats request
  std::function<void(RetiredSession)> retire;  // takes the loaders and arena of a gone client
  checkpoint::CheckpointStage* checkpoints = nullptr;  // null: no checkpoint staging
};

class LocalSession {
 public:
  LocalSession(UniqueFd fd, const PeerCredentials& peer, const LocalSessionOptions& options,
               SessionServices services);
  ~LocalSession() { Join(); }
  LocalSession(const LocalSession&) = delete;
  LocalSession& operator=(const LocalSession&) = delete;

  // Starts the session's thread, which serves the client until it goes, then hands its loaders
  // and arena to services.retire and sets done().
  void Start();
  // Waits for the session's thread to end.
  void Join();
  // Shuts the socket down (the client sees the daemon go at once, and nothing it is sent later
  // reaches it) and cancels the loaders (a waiting NextBatch wakes); the thread then ends.
  void Shutdown();
  // The thread has ended (Join() will not wait).
  bool done() const { return done_.load(); }
  // Open loaders / arena slots in use.
  size_t loader_count() const;
  uint32_t slots_in_use() const;

 private:
  // The thread: reads requests, answers each, and hands the loaders and arena on.
  void Serve();
  enum class Reply { kSend, kNone, kClose };
  // Handles one request into *resp (an error included); *pass_fd gets a descriptor to pass with
  // the answer. kNone: the request wants no answer; kClose: end the session.
  Reply Handle(const v1::LocalRequest& req, v1::LocalResponse* resp, int* pass_fd);
  // Hello: checks the protocol version and creates the arena (its fd to pass).
  Status Hello(uint32_t version, v1::HelloResponse* h, int* pass_fd);
  // OpenLoader: starts a loader (LoaderFactory) and fills the response; *pass_fd gets the batch
  // ring's descriptor.
  Status OpenLoader(const v1::OpenLoaderRequest& request, v1::OpenLoaderResponse* r, int* pass_fd);
  // NextBatch: waits (bounded, and not past the client leaving) for a ring entry or a batch.
  Status NextBatch(const v1::NextBatchRequest& req, v1::NextBatchResponse* r);
  Status ReleaseBatch(uint64_t loader_id, uint32_t slot);
  Status LoaderState(uint64_t loader_id, v1::LoaderStateResponse* r);
  Status CloseLoader(uint64_t loader_id);
  // WarmDataset: the running job for the dataset, or a new one.
  Status StartWarm(const std::string& dataset, v1::WarmDatasetResponse* r);
  // After the last request: cancels the loaders, hands them and the arena on, closes the socket.
  void Disconnected();

  UniqueFd fd_;  // closed under mu_ (see Shutdown)
  LocalCheckpoints checkpoints_;
  UniqueFd passing_;  // a descriptor passed with the answer being sent (closed after it)
  const std::string who_;  // "pid P uid U", for log lines
  const LocalSessionOptions options_;
  const SessionServices services_;
  uint32_t protocol_version_ = 0;  // the Hello's; the session's thread only
  std::thread thread_;
  std::atomic<bool> done_{false};

  // Guards arena_ (set once) and loaders_ for readers on other threads; see above.
  mutable Mutex mu_;
  std::unique_ptr<Arena> arena_;
  std::map<uint64_t, std::unique_ptr<LoaderPipeline>> loaders_;
};

}  // namespace shardcache::serve
