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
  std::lock_guard<std::mutex> l(mu);
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
  std::lock_guard<std::mutex> l(mu);
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

void Connection::AppendLocked(const v1::LocalRequest& req) {
  const size_t len = req.ByteSizeLong();
  for (int i = 0; i < 4; ++i) unsent.push_back(static_cast<char>((len >> (8 * i)) & 0xff));
  unsent += req.SerializeAsString();
}

Status Connection::FlushLocked() {
  size_t off = 0;
  while (off < unsent.size()) {
    ssize_t w = ::send(fd, unsent.data() + off, unsent.size() - off, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) return Unavailable(std::string("sending to shardcached: ") + std::strerror(errno));
    off += static_cast<size_t>(w);
  }
  unsent.clear();
  unsent_releases = 0;
  return Status::Ok();
}

Status Connection::ReceiveLocked(v1::LocalResponse* resp, int* received_fd) {
  if (received_fd) *received_fd = -1;
  uint8_t hdr[4];
  SC_RETURN_IF_ERROR(Receive(hdr, 4, received_fd));
  const uint32_t rlen = uint32_t{hdr[0]} | uint32_t{hdr[1]} << 8 | uint32_t{hdr[2]} << 16 |
                        uint32_t{hdr[3]} << 24;
  if (rlen > kMaxMessageBytes) {
    return DataLoss("shardcached sent a " + std::to_string(rlen) + "-byte response (limit " +
                    std::to_string(kMaxMessageBytes) + ")");
  }
  std::string rbody(rlen, '\0');
  if (rlen) SC_RETURN_IF_ERROR(Receive(reinterpret_cast<uint8_t*>(rbody.data()), rlen, received_fd));
  if (!resp->ParseFromString(rbody)) return DataLoss("malformed response from shardcached");
  return Status::Ok();
}

Status Connection::Receive(uint8_t* p, size_t n, int* received_fd) {
  while (n > 0) {
    if (in_begin == in_end) {
      iovec iov{in.data(), in.size()};
      msghdr msg{};
      msg.msg_iov = &iov;
      msg.msg_iovlen = 1;
      alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 4)];
      msg.msg_control = control;
      msg.msg_controllen = sizeof(control);
      ssize_t r = ::recvmsg(fd, &msg, MSG_CMSG_CLOEXEC);
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) return Unavailable(std::string("reading from shardcached: ") + std::strerror(errno));
      if (r == 0) return Unavailable("shardcached closed the connection");
      for (cmsghdr* cm = CMSG_FIRSTHDR(&msg); cm; cm = CMSG_NXTHDR(&msg, cm)) {
        if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS) continue;
        const size_t count = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < count; ++i) {
          int got;
          std::memcpy(&got, CMSG_DATA(cm) + i * sizeof(int), sizeof(int));
          if (received_fd && *received_fd < 0) {
            *received_fd = got;
          } else {
            close(got);  // unexpected: never leak a descriptor
          }
        }
      }
      in_begin = 0;
      in_end = static_cast<size_t>(r);
    }
    const size_t take = std::min(n, in_end - in_begin);
    std::memcpy(p, in.data() + in_begin, take);
    in_begin += take;
    p += take;
    n -= take;
  }
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
  v1::LocalRequest req;
  req.mutable_hello()->set_protocol_version(kProtocolVersion);
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


Result<std::shared_ptr<Connection>> Session::Replace(const std::shared_ptr<Connection>& lost) {
  std::lock_guard<std::mutex> l(mu_);
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
