// LocalControl: one connection to a node daemon's local service (its listen.socket) for
// control requests only — no Hello, no arena (shardctl warm --socket, shardctl checkpoints).
// Framing as in local.proto (proto/shardcache/local_wire.h).
#pragma once

#include <string>

#include "common/fs.h"
#include "common/status.h"
#include "shardcache/local.pb.h"
#include "shardcache/local_wire.h"

namespace shardcache::shardctl {

class LocalControl {
 public:
  // Unavailable naming the path when nobody listens there, PermissionDenied when refused.
  static Result<LocalControl> Connect(const std::string& path);

  // Sends req and reads its response; the response's own error code becomes the status.
  // `what` names the request in errors.
  Status Call(const v1::LocalRequest& req, v1::LocalResponse* resp, const std::string& what);

 private:
  std::string path_;
  UniqueFd fd_;
  local_wire::FrameReader reader_;  // on fd_, set by Connect
};

}  // namespace shardcache::shardctl
