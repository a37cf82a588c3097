// The local protocol's frame codec (proto/shardcache/local_wire.h) over a real socketpair:
// pipelined frames, a descriptor passed with a frame, the frame limit, and the peer closing.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>

#include "common/fs.h"
#include "shardcache/local.pb.h"
#include "shardcache/local_wire.h"

using namespace shardcache;

namespace {

struct SocketPair {
  UniqueFd a, b;
  SocketPair() {
    int fds[2];
    REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) == 0);
    a.Reset(fds[0]);
    b.Reset(fds[1]);
  }
};

v1::LocalRequest NextBatch(uint64_t loader) {
  v1::LocalRequest r;
  r.mutable_next_batch()->set_loader_id(loader);
  return r;
}

}  // namespace

TEST_CASE("local wire: pipelined frames arrive one by one, in order", "[serve][wire]") {
  SocketPair s;
  std::string out;
  for (uint64_t i = 1; i <= 3; ++i) local_wire::AppendFrame(NextBatch(i), &out);
  local_wire::AppendFrame(v1::LocalRequest(), &out);  // an empty message is a 0-byte frame
  REQUIRE(local_wire::WriteAll(s.a.get(), out).ok());
  local_wire::FrameReader reader(s.b.get());
  std::string body;
  for (uint64_t i = 1; i <= 3; ++i) {
    REQUIRE(reader.Next(&body, nullptr).ok());
    v1::LocalRequest r;
    REQUIRE(r.ParseFromString(body));
    CHECK(r.next_batch().loader_id() == i);
  }
  REQUIRE(reader.Next(&body, nullptr).ok());
  CHECK(body.empty());
}

TEST_CASE("local wire: a descriptor sent with a frame reaches the reader; unasked ones are closed",
          "[serve][wire]") {
  SocketPair s;
  UniqueFd file(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  REQUIRE(file.valid());
  std::string frame;
  local_wire::AppendFrame(NextBatch(7), &frame);
  REQUIRE(local_wire::WriteAll(s.a.get(), frame, file.get()).ok());
  REQUIRE(local_wire::WriteAll(s.a.get(), frame, file.get()).ok());
  local_wire::FrameReader reader(s.b.get());
  std::string body;
  int got = -1;
  REQUIRE(reader.Next(&body, &got).ok());
  REQUIRE(got >= 0);
  CHECK(::fcntl(got, F_GETFD) >= 0);
  ::close(got);
  // The second frame's descriptor arrives with a reader that did not ask: closed, not leaked.
  const int probe = ::dup(file.get());
  REQUIRE(probe >= 0);
  ::close(probe);  // the lowest free number now; a leaked descriptor would take it
  REQUIRE(reader.Next(&body, nullptr).ok());
  const int next = ::dup(file.get());
  CHECK(next == probe);
  ::close(next);
}

TEST_CASE("local wire: a frame over the limit is DataLoss, the peer closing is Unavailable",
          "[serve][wire][faults]") {
  SECTION("oversized") {
    SocketPair s;
    const uint32_t len = local_wire::kMaxFrameBytes + 1;
    const std::string hdr = {static_cast<char>(len & 0xff), static_cast<char>((len >> 8) & 0xff),
                             static_cast<char>((len >> 16) & 0xff), static_cast<char>(len >> 24)};
    REQUIRE(local_wire::WriteAll(s.a.get(), hdr).ok());
    local_wire::FrameReader reader(s.b.get());
    std::string body;
    const Status st = reader.Next(&body, nullptr);
    CHECK(st.code() == StatusCode::kDataLoss);
    CHECK_THAT(st.message(), Catch::Contains(std::to_string(len) + "-byte frame"));
    CHECK(body.size() < len);  // nothing allocated for it
  }
  SECTION("closed mid-frame and before a frame") {
    SocketPair s;
    REQUIRE(local_wire::WriteAll(s.a.get(), std::string("\x08\x00\x00\x00\x01\x02", 6)).ok());
    s.a.Reset();
    local_wire::FrameReader reader(s.b.get());
    std::string body;
    const Status st = reader.Next(&body, nullptr);
    CHECK(st.code() == StatusCode::kUnavailable);
    CHECK(reader.closed());
  }
  SECTION("writing to a closed peer") {
    SocketPair s;
    s.b.Reset();
    CHECK(local_wire::WriteAll(s.a.get(), "abcd").code() == StatusCode::kUnavailable);  // EPIPE, no SIGPIPE
  }
}
