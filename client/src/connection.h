// The client's connection to its shardcached: one Unix socket with its framing, the mapped
// arena, and the Session that replaces a connection the daemon dropped (restart, upgrade).
//
// Internal to libshardcache (not installed).
#pragma once

#include <sys/types.h>
#include <unistd.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/mutex.h"
#include "common/status.h"
#include "shardcache/local.pb.h"
#include "shardcache/local_wire.h"

namespace shardcache::client_internal {

constexpr uint32_t kMaxUnsentReleases = 4;

// One socket and one arena mapping.
//
// The daemon answers requests in order, one response each, except releases sent with
// no_reply (protocol 4). Besides plain calls (send, wait for the answer) the connection queues
// those releases: they are written together with the next call, or once kMaxUnsentReleases
// wait. Every write wakes a daemon thread, and on a busy node that thread can take the CPU from
// the trainer, so a trainer pays one wake-up per few batches instead of one per batch. With no
// answers to releases, the only response in flight is the current call's, and a descriptor
// that comes with it is that call's. Everything is serialized by mu.
struct Connection {
  int fd = -1;
  pid_t owner = ::getpid();  // a forked child must not talk on its parent's socket
  const uint8_t* arena = nullptr;
  uint64_t arena_bytes = 0;
  uint32_t slot_count = 0;
  uint64_t slot_bytes = 0;

  Mutex mu;
  bool broken GUARDED_BY(mu) = false;  // every call fails fast
  std::string unsent GUARDED_BY(mu);   // queued release frames
  uint32_t unsent_releases GUARDED_BY(mu) = 0;
  local_wire::FrameReader reader GUARDED_BY(mu);  // on fd, set by Open

  ~Connection();

  // Connects to the daemon at socket_path, says Hello and maps the arena. PermissionDenied
  // when the daemon refuses this uid; Unavailable when nobody listens; FailedPrecondition from
  // a daemon of another protocol version.
  static Result<std::shared_ptr<Connection>> Open(const std::string& socket_path);

  // The connection failed on the wire (the daemon went away): every call fails fast.
  bool Broken() {
    MutexLock l(&mu);
    return broken;
  }

  // Sends req (after the queued releases) and reads its response; *received_fd gets a
  // descriptor passed with it (or -1).
  Status Call(const v1::LocalRequest& req, v1::LocalResponse* resp, int* received_fd = nullptr);
  // Queues a ReleaseBatch (sent with no_reply: nothing to wait for, nothing to read).
  void QueueRelease(const v1::LocalRequest& req);

  // True in a child process made by fork(): its requests would interleave with the parent's on
  // one socket.
  bool Inherited() const { return ::getpid() != owner; }
  static Status InheritedError();
  static Status StatusOf(const v1::LocalResponse& r);

 private:
  void AppendLocked(const v1::LocalRequest& req) REQUIRES(mu);
  Status FlushLocked() REQUIRES(mu);
  // The next response, and a descriptor passed with it (SCM_RIGHTS).
  Status ReceiveLocked(v1::LocalResponse* resp, int* received_fd) REQUIRES(mu);
};

// The client's current connection, and its replacement after the daemon dropped it: the
// first caller that finds the connection broken reconnects (retrying while the daemon restarts,
// up to reconnect_timeout_ms), the others get the connection it made.
//
// Thread safety: all methods may be called from any thread.
class Session {
 public:
  Session(std::string socket_path, uint32_t reconnect_timeout_ms, std::shared_ptr<Connection> first)
      : socket_path_(std::move(socket_path)), reconnect_timeout_ms_(reconnect_timeout_ms), conn_(std::move(first)) {}

  std::shared_ptr<Connection> current() const {
    MutexLock l(&mu_);
    return conn_;
  }
  // The connection that replaces `lost`: the current one when someone replaced it already,
  // else a new one. Unavailable (saying since when it tried) when reconnecting is off or the
  // daemon is not back within the timeout; PermissionDenied and FailedPrecondition at once.
  Result<std::shared_ptr<Connection>> Replace(const std::shared_ptr<Connection>& lost);
  // One request on the current connection, once more on its replacement when the daemon
  // restarted in between. *used (nullable) gets the connection that answered; *received_fd a
  // descriptor passed with the answer (or -1).
  Status Call(const v1::LocalRequest& req, v1::LocalResponse* resp, int* received_fd = nullptr,
              std::shared_ptr<Connection>* used = nullptr);

 private:
  const std::string socket_path_;
  const uint32_t reconnect_timeout_ms_;
  mutable Mutex mu_;
  std::shared_ptr<Connection> conn_ GUARDED_BY(mu_);
};

}  // namespace shardcache::client_internal
