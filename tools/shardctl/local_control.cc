#include "tools/shardctl/local_control.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace shardcache::shardctl {

Result<LocalControl> LocalControl::Connect(const std::string& path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof(addr.sun_path)) {
    return InvalidArgument("socket path '" + path + "' is empty or longer than " +
                           std::to_string(sizeof(addr.sun_path) - 1) + " bytes");
  }
  struct stat st{};
  if (::stat(path.c_str(), &st) != 0) {
    const int err = errno;
    if (err == ENOENT) {
      return Unavailable("no shardcached socket at " + path +
                         ": is the daemon running, and is this its listen.socket?");
    }
    return ErrnoStatus(err, "socket " + path);
  }
  if (!S_ISSOCK(st.st_mode)) return FailedPrecondition(path + " is not a Unix socket");
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  LocalControl c;
  c.path_ = path;
  c.fd_.Reset(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!c.fd_.valid()) return ErrnoStatus(errno, "socket(AF_UNIX)");
  if (::connect(c.fd_.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    const int err = errno;
    if (err == ECONNREFUSED) {
      return Unavailable("nobody is listening on " + path + " (a stale socket: shardcached is not running)");
    }
    if (err == EACCES || err == EPERM) {
      return PermissionDenied("connecting to " + path + ": " + std::strerror(err));
    }
    return Unavailable("connecting to shardcached at " + path + ": " + std::strerror(err));
  }
  c.reader_ = local_wire::FrameReader(c.fd_.get());
  return c;
}

Status LocalControl::Call(const v1::LocalRequest& req, v1::LocalResponse* resp, const std::string& what) {
  std::string frame;
  local_wire::AppendFrame(req, &frame);
  // A failed send is reported after trying to read: a refused peer gets a PermissionDenied
  // answer before the daemon closes, and that says more than EPIPE.
  const Status send_error = local_wire::WriteAll(fd_.get(), frame);
  std::string body;
  if (Status s = reader_.Next(&body, nullptr); !s.ok()) {
    if (!send_error.ok()) return send_error.WithContext("sending " + what + " to shardcached at " + path_);
    if (reader_.closed()) {
      // An unknown request closes the connection: a daemon from before local protocol 2.
      return Unavailable("shardcached at " + path_ + " closed the connection on " + what +
                         " (a daemon too old for this request; or it is stopping)");
    }
    return s.WithContext("reading the answer to " + what + " from shardcached at " + path_);
  }
  if (!resp->ParseFromString(body)) return DataLoss("malformed response from shardcached at " + path_);
  if (resp->code() != 0) return Status(static_cast<StatusCode>(resp->code()), resp->message());
  return Status::Ok();
}

}  // namespace shardcache::shardctl
