#include "client/src/connection.h"

#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

namespace shardcache::client_internal {

Status Connection::Call(const v1::LocalRequest& req, v1::LocalResponse* resp, int* received_fd) {
  if (Inherited()) return InheritedError();
  MutexLock l(&mu);
  if (broken) return Unavailable("connection to shardcached was lost");
  AppendLocked(req);
  Status send_error = FlushLocked();
  // After a failed send, a response may still be waiting: a daemon that refuses a peer answers
  // PermissionDenied before it closes, and that answer says more than EPIPE.
  Status s = ReceiveLocked(resp, received_fd);
  if (!send_error.ok() || !s.ok()) broken = true;
  if (!s.ok()) return send_error.ok() ? s : send_error;
  return StatusOf(*resp);
}

void Connection::QueueRelease(const v1::LocalRequest& req) {
  if (Inherited()) return;  // the parent releases its own batches
  MutexLock l(&mu);
  if (broken) return;
  AppendLocked(req);
  if (++unsent_releases >= kMaxUnsentReleases && !FlushLocked().ok()) broken = true;
}

Status Connection::InheritedError() {
  return FailedPrecondition("this shardcache connection was opened by another process (fork); "
                            "connect a new Client in this process");
}

Status Connection::StatusOf(const v1::LocalResponse& r) {
  if (r.code() == 0) return Status::Ok();
  return Status(static_cast<StatusCode>(r.code()), r.message());
}

void Connection::AppendLocked(const v1::LocalRequest& req) { local_wire::AppendFrame(req, &unsent); }

Status Connection::FlushLocked() {
  Status s = local_wire::WriteAll(fd, unsent);
  if (!s.ok()) return s.WithContext("sending to shardcached");
  unsent.clear();
  unsent_releases = 0;
  return Status::Ok();
}

Status Connection::ReceiveLocked(v1::LocalResponse* resp, int* received_fd) {
  std::string body;
  if (Status s = reader.Next(&body, received_fd); !s.ok()) {
    if (reader.closed()) return Unavailable("shardcached closed the connection");
    return s.WithContext("reading from shardcached");
  }
  if (!resp->ParseFromString(body)) return DataLoss("malformed response from shardcached");
  return Status::Ok();
}

Connection::~Connection() {
  if (arena != nullptr) munmap(const_cast<uint8_t*>(arena), arena_bytes);
  if (fd >= 0) close(fd);
}

Result<std::shared_ptr<Connection>> Connection::Open(const std::string& socket_path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (socket_path.empty() || socket_path.size() >= sizeof(addr.sun_path)) {
    return InvalidArgument("socket path '" + socket_path + "' is empty or too long");
  }
  std::memcpy(addr.sun_path, socket_path.c_str(), socket_path.size() + 1);
  auto conn = std::make_shared<Connection>();
  conn->fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (conn->fd < 0) return Internal(std::string("socket: ") + std::strerror(errno));
  if (::connect(conn->fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    const int err = errno;
    if (err == EACCES || err == EPERM) {
      return PermissionDenied("connecting to " + socket_path + ": " + std::strerror(err));
    }
    return Unavailable("connecting to shardcached at " + socket_path + ": " + std::strerror(err));
  }
  {
    MutexLock l(&conn->mu);  // not shared yet; taken for the analysis
    conn->reader = local_wire::FrameReader(conn->fd);
  }
  v1::LocalRequest req;
  req.mutable_hello()->set_protocol_version(local_wire::kProtocolVersion);
  v1::LocalResponse resp;
  int arena_fd = -1;
  Status s = conn->Call(req, &resp, &arena_fd);
  if (!s.ok()) {
    if (arena_fd >= 0) close(arena_fd);
    return s.WithContext("hello to shardcached at " + socket_path);
  }
  if (arena_fd < 0) return DataLoss("shardcached did not pass the arena descriptor");
  const auto& h = resp.hello();
  if (h.slot_count() == 0 || h.slot_bytes() == 0 ||
      h.slot_bytes() > h.arena_bytes() / h.slot_count()) {
    close(arena_fd);
    return DataLoss("shardcached described an inconsistent arena");
  }
  // Read-only: the trainer never writes batches; the daemon sealed the size.
  void* p = mmap(nullptr, h.arena_bytes(), PROT_READ, MAP_SHARED, arena_fd, 0);
  const int err = errno;
  close(arena_fd);  // the mapping keeps the memory alive
  if (p == MAP_FAILED) return Internal(std::string("mapping the batch arena: ") + std::strerror(err));
  conn->arena = static_cast<const uint8_t*>(p);
  conn->arena_bytes = h.arena_bytes();
  conn->slot_count = h.slot_count();
  conn->slot_bytes = h.slot_bytes();
  return conn;
}


Status Session::Call(const v1::LocalRequest& req, v1::LocalResponse* resp, int* received_fd,
                     std::shared_ptr<Connection>* used) {
  std::shared_ptr<Connection> conn = current();
  Status s = conn->Call(req, resp, received_fd);
  if (!s.ok() && conn->Broken()) {
    SC_ASSIGN_OR_RETURN(conn, Replace(conn));
    s = conn->Call(req, resp, received_fd);
  }
  if (used != nullptr) *used = std::move(conn);
  return s;
}

Result<std::shared_ptr<Connection>> Session::Replace(const std::shared_ptr<Connection>& lost) {
  MutexLock l(&mu_);
  if (conn_ != lost && !conn_->Broken()) return conn_;
  if (reconnect_timeout_ms_ == 0) return Unavailable("the connection to shardcached at " + socket_path_ + " was lost");
  // The daemon restarts (systemd, a rolling upgrade): its socket refuses or is missing until
  // the successor listens. Retry with backoff; a refusal of this uid or protocol is final.
  const auto start = std::chrono::steady_clock::now();
  const auto deadline = start + std::chrono::milliseconds(reconnect_timeout_ms_);
  auto pause = std::chrono::milliseconds(20);
  for (;;) {
    auto fresh = Connection::Open(socket_path_);
    if (fresh.ok()) {
      conn_ = std::move(*fresh);
      return conn_;
    }
    const StatusCode code = fresh.status().code();
    if (code == StatusCode::kPermissionDenied || code == StatusCode::kFailedPrecondition ||
        code == StatusCode::kInvalidArgument || std::chrono::steady_clock::now() + pause > deadline) {
      return Status(code,
                    "the connection to shardcached was lost and reconnecting for " +
                        std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(
                                           std::chrono::steady_clock::now() - start)
                                           .count()) +
                        " ms failed: " + fresh.status().message());
    }
    std::this_thread::sleep_for(pause);
    pause = std::min<std::chrono::milliseconds>(pause * 2, std::chrono::milliseconds(500));
  }
}

}  // namespace shardcache::client_internal
