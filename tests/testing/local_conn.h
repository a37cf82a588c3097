// LocalConn: a bare connection to a LocalService speaking the framed local protocol by hand
// (LocalRequest / LocalResponse), for tests of what the client library never sends: old
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
    std::string body;
    req.SerializeToString(&body);
    const uint32_t len = static_cast<uint32_t>(body.size());
    std::string frame(4, '\0');
    for (int i = 0; i < 4; ++i) frame[i] = static_cast<char>((len >> (8 * i)) & 0xff);
    frame += body;
    REQUIRE(::send(fd_.get(), frame.data(), frame.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(frame.size()));
  }

  // Sends req and reads the next response; a descriptor passed with the response lands in
  // *passed_fd (the caller closes it), or is closed when passed_fd is null.
  v1::LocalResponse Call(const v1::LocalRequest& req, int* passed_fd = nullptr) {
    Send(req);
    if (passed_fd) *passed_fd = -1;
    uint8_t hdr[4];
    ReadFull(hdr, 4, passed_fd);
    const uint32_t rlen = uint32_t{hdr[0]} | uint32_t{hdr[1]} << 8 | uint32_t{hdr[2]} << 16 | uint32_t{hdr[3]} << 24;
    std::string rbody(rlen, '\0');
    ReadFull(reinterpret_cast<uint8_t*>(rbody.data()), rlen, passed_fd);
    v1::LocalResponse resp;
    REQUIRE(resp.ParseFromString(rbody));
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

 private:
  void ReadFull(uint8_t* p, size_t n, int* passed_fd) {
    while (n > 0) {
      iovec iov{p, n};
      msghdr msg{};
      msg.msg_iov = &iov;
      msg.msg_iovlen = 1;
      alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))];
      msg.msg_control = control;
      msg.msg_controllen = sizeof(control);
      const ssize_t r = ::recvmsg(fd_.get(), &msg, MSG_CMSG_CLOEXEC);
      REQUIRE(r > 0);
      for (cmsghdr* cm = CMSG_FIRSTHDR(&msg); cm; cm = CMSG_NXTHDR(&msg, cm)) {
        if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS) continue;
        int got;
        std::memcpy(&got, CMSG_DATA(cm), sizeof(int));
        if (passed_fd && *passed_fd < 0) {
          *passed_fd = got;
        } else {
          ::close(got);
        }
      }
      p += r;
      n -= static_cast<size_t>(r);
    }
  }
  UniqueFd fd_;
};

}  // namespace shardcache::testing
