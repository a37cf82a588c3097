// Hostile local clients against a real node daemon: what they send must not flood its log.
#include <catch2/catch.hpp>
#include <google/protobuf/stubs/logging.h>

#include <string>

#include "integration/daemons.h"
#include "shardcache/local.pb.h"
#include "testing/local_conn.h"

using namespace shardcache;
using namespace shardcache::testing;

namespace {

size_t CountLines(const std::string& text, const std::string& needle) {
  size_t n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

}  // namespace

TEST_CASE("300 requests with non-UTF-8 strings are refused and logged a few times, not once each",
          "[integration][faults]") {
  TempDir dir;
  REQUIRE(MakeDirs(dir / "data").ok());
  Daemon node(dir, "node", "file://" + (dir / "data"), 64 << 20, 8 << 20, dir / "node.sock");
  node.Start();
  // This side's libprotobuf complains too (serializing a non-UTF-8 string): not under test.
  auto* const previous = google::protobuf::SetLogHandler(nullptr);
  for (int i = 0; i < 300; ++i) {
    LocalConn conn(node.socket);
    v1::LocalRequest req;
    req.mutable_open_loader()->set_dataset(std::string("\xff\xfe", 2));  // not UTF-8: unparseable
    conn.Send(req);
    CHECK(conn.ReadUntilClosed());  // the daemon closes the connection
  }
  google::protobuf::SetLogHandler(previous);
  REQUIRE(node.proc->Running());
  auto log = ReadFileToString(node.log);
  REQUIRE(log.ok());
  INFO(LogTail(node.log));
  // Rate-limited (5 a second): libprotobuf's own line per message went straight to stderr.
  CHECK(CountLines(*log, "invalid UTF-8") <= 20);
  CHECK(CountLines(*log, "malformed") <= 20);
}
