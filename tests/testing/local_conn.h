// LocalConn: a bare connection to a LocalService speaking the local protocol by hand
// (LocalRequest / LocalResponse in local_wire frames), for tests of what the client library never sends: old
// protocol versions, requests out of order, hostile values.
#pragma once

#include <catch2/catch.hpp>

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <string>

#include "common/fs.h"
#include "shardcache/local.pb.h"
#include "shardcache/local_wire.h"

namespace shardcache::testing {

class LocalConn {
 public:
  explicit LocalConn(const std::string& path) : fd_(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0)) {
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strcpy(addr.sun_path, path.c_str());
    REQUIRE(::connect(fd_.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
    // A daemon that stops reading or answering fails the test instead of hanging it.
    const timeval limit{10, 0};
    REQUIRE(::setsockopt(fd_.get(), SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof(limit)) == 0);
    REQUIRE(::setsockopt(fd_.get(), SOL_SOCKET, SO_SNDTIMEO, &limit, sizeof(limit)) == 0);
  }

  // Sends req without reading anything.
  void Send(const v1::LocalRequest& req) {
    std::string frame;
    local_wire::AppendFrame(req, &frame);
    const Status s = local_wire::WriteAll(fd_.get(), frame);
    INFO(s.ToString());
    REQUIRE(s.ok());
  }

  // Sends req and reads the next response; a descriptor passed with the response lands in
  // *passed_fd (the caller closes it), or is closed when passed_fd is null.
  v1::LocalResponse Call(const v1::LocalRequest& req, int* passed_fd = nullptr) {
    Send(req);
    std::string body;
    const Status s = reader_.Next(&body, passed_fd);
    INFO(s.ToString());
    REQUIRE(s.ok());
    v1::LocalResponse resp;
    REQUIRE(resp.ParseFromString(body));
    return resp;
  }

  // Hello at `version`, which must succeed. The arena's descriptor lands in *arena_fd (the
  // caller closes it), or is closed when arena_fd is null.
  v1::HelloResponse Hello(uint32_t version, int* arena_fd = nullptr) {
    v1::LocalRequest req;
    req.mutable_hello()->set_protocol_version(version);
    int fd = -1;
    auto r = Call(req, &fd);
    REQUIRE(r.code() == 0);
    REQUIRE(fd >= 0);
    if (arena_fd) {
      *arena_fd = fd;
    } else {
      ::close(fd);
    }
    return r.hello();
  }

  // OpenLoader of `dataset` for one rank, which must succeed; a ring's descriptor as in Hello.
  v1::OpenLoaderResponse OpenLoader(const std::string& dataset, uint32_t batch_size, bool ring,
                                    int* ring_fd = nullptr) {
    v1::LocalRequest req;
    req.mutable_open_loader()->set_dataset(dataset);
    req.mutable_open_loader()->set_batch_size(batch_size);
    req.mutable_open_loader()->set_batch_ring(ring);
    req.mutable_open_loader()->set_world_size(1);
    auto r = Call(req, ring_fd);
    REQUIRE(r.code() == 0);
    return r.open_loader();
  }

  // Reads and drops whatever the daemon sends until it closes the connection; false when it
  // does not within the receive timeout.
  bool ReadUntilClosed() {
    std::string body;
    for (;;) {
      if (!reader_.Next(&body, nullptr).ok()) return reader_.closed();
    }
  }

 private:
  UniqueFd fd_;
  local_wire::FrameReader reader_{fd_.get()};
};

}  // namespace shardcache::testing
