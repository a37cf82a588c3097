// The local protocol's wire (local.proto between a trainer's libshardcache and its node's
// shardcached over a Unix stream socket): versions, the frame limit and the frame codec. Every
// speaker of the protocol — the daemon, the client library, shardctl and the tests that talk
// to the daemon by hand — uses these; nothing else frames local messages.
//
// A frame is a 4-byte little-endian length followed by that many bytes of one serialized
// LocalRequest or LocalResponse. A response may carry one descriptor (SCM_RIGHTS: the arena
// memfd after Hello, a batch ring after OpenLoader), sent with its first bytes.
//
// Thread safety: FrameReader is not thread-safe (one reader per socket); the functions are.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace google::protobuf {
class MessageLite;
}

namespace shardcache::local_wire {

// The version clients send in Hello (history in local.proto). The daemon accepts every version
// from kMinProtocolVersion up to it and answers in the client's.
inline constexpr uint32_t kProtocolVersion = 6;
inline constexpr uint32_t kMinProtocolVersion = 1;

// Largest frame either side sends or accepts. A NextBatchResponse of 100k samples is ~3 MiB.
inline constexpr uint32_t kMaxFrameBytes = 16u << 20;

// Appends `message` to *out as one frame.
void AppendFrame(const google::protobuf::MessageLite& message, std::string* out);

// Writes all of `bytes` to the socket (EINTR retried, no SIGPIPE), attaching `pass_fd` to the
// first write when it is >= 0. The error names errno.
Status WriteAll(int fd, std::string_view bytes, int pass_fd = -1);

// Reads frames from a stream socket through a buffer (several pipelined frames cost one read).
class FrameReader {
 public:
  // fd -1: a reader to assign one to later (it owns no descriptor either way).
  explicit FrameReader(int fd = -1) : fd_(fd) {}

  // The next frame's bytes into *body. A descriptor that arrives while the frame is read goes
  // to *passed_fd (-1 when none; the caller owns it); further ones, or all when passed_fd is
  // null, are closed. Errors: Unavailable when the peer closed the socket (closed() is then
  // true: before a frame began, a clean end) or a read failed (error_number() says why);
  // DataLoss for a frame longer than kMaxFrameBytes.
  Status Next(std::string* body, int* passed_fd);

  bool closed() const { return closed_; }
  int error_number() const { return errno_; }

 private:
  Status Fill(int* passed_fd);
  Status Take(uint8_t* p, size_t n, int* passed_fd);

  int fd_;
  std::vector<uint8_t> buf_ = std::vector<uint8_t>(64 << 10);
  size_t begin_ = 0, end_ = 0;
  bool closed_ = false;
  int errno_ = 0;
};

}  // namespace shardcache::local_wire
