// ObjectClient against fault_server.py: dropped connections, throttling, refused signatures.
#include <catch2/catch.hpp>
#include <atomic>
#include <chrono>
#include <future>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/fs.h"
#include "objstore/object_client.h"
#include "objstore/objstore_metrics.h"
#include "objstore/test_servers.h"
#include "testing/temp_dir.h"

namespace shardcache::objstore {
namespace {

constexpr size_t kSize = 1 << 20;

std::string Expected(uint64_t offset, uint64_t length) {
  std::string s(length, '\0');
  for (uint64_t i = 0; i < length; ++i) s[i] = testing::FaultServer::Byte(offset + i);
  return s;
}

std::unique_ptr<ObjectClient> OpenClient(const testing::FaultServer& server, uint32_t max_attempts = 4,
                                         const std::string& secret = "NotThePrintedSecret") {
  ObjectStoreOptions o;
  o.endpoint = server.endpoint();
  o.credentials = {"AKIDEXAMPLE", secret, "", ""};
  o.max_attempts = max_attempts;
  o.backoff_initial_ms = 5;
  o.backoff_max_ms = 20;
  auto client = ObjectClient::Open(*ParseObjectUri("s3://bucket/prefix"), o);
  REQUIRE(client.ok());
  return std::move(*client);
}

size_t Count(const std::string& haystack, const std::string& needle) {
  size_t n = 0;
  for (size_t p = haystack.find(needle); p != std::string::npos; p = haystack.find(needle, p + 1)) ++n;
  return n;
}

TEST_CASE("a connection dropped mid-body resumes at the first missing byte", "[objstore][faults]") {
  testing::FaultServer server("drop:2", kSize);
  auto client = OpenClient(server);
  const uint64_t retries = RetriesCounter("dropped")->Value();
  auto r = client->ReadRange("prefix/obj", 1000, 400000);
  INFO(r.status().ToString() << "\n" << server.RequestLog());
  REQUIRE(r.ok());
  CHECK(*r == Expected(1000, 400000));
  // Half of the range, then half of the rest, then the rest: never from zero again.
  const std::string log = server.RequestLog();
  CHECK(Count(log, "bytes=1000-400999") == 1);
  CHECK(Count(log, "bytes=201000-400999") == 1);
  CHECK(Count(log, "bytes=301000-400999") == 1);
  CHECK(Count(log, "GET ") == 3);
  CHECK(RetriesCounter("dropped")->Value() - retries == 2);

  // Into the caller's buffer, the resumed attempts write where the dropped ones stopped.
  testing::FaultServer again("drop:2", kSize);
  std::string buffer(400000, '\0');
  auto direct = OpenClient(again)->ReadRanges({RangeRead{"prefix/obj", 1000, 400000, "", kUnknownSize,
                                                          reinterpret_cast<uint8_t*>(buffer.data())}});
  REQUIRE(direct[0].ok());
  CHECK(buffer == Expected(1000, 400000));
  CHECK(Count(again.RequestLog(), "GET ") == 3);
}

TEST_CASE("a server that keeps dropping gives Unavailable naming the object and the range", "[objstore][faults]") {
  testing::FaultServer server("drop:1000", kSize);
  auto client = OpenClient(server, 3);
  auto r = client->ReadRange("prefix/obj", 0, 80000);
  REQUIRE(r.status().code() == StatusCode::kUnavailable);
  CHECK_THAT(r.status().message(), Catch::Contains("GET s3://bucket/prefix/obj bytes 0-79999 (70000 of 80000 received)"));
  CHECK_THAT(r.status().message(), Catch::Contains("gave up after 3 attempts"));
  CHECK(Count(server.RequestLog(), "GET ") == 3);
}

TEST_CASE("an object that changes between a dropped attempt and its resumption is refused", "[objstore][faults]") {
  testing::FaultServer server("drop_change", kSize);
  auto client = OpenClient(server);
  auto r = client->ReadRange("prefix/obj", 0, 100000);
  REQUIRE(r.status().code() == StatusCode::kFailedPrecondition);
  CHECK_THAT(r.status().message(), Catch::Contains("object s3://bucket/prefix/obj changed since it was indexed "
                                                   "(ETag \"v1\" -> \"v2\")"));
}

TEST_CASE("503 SlowDown is retried with backoff and then succeeds", "[objstore][faults]") {
  testing::FaultServer server("slowdown:3", kSize);
  auto client = OpenClient(server);
  const uint64_t throttled = RetriesCounter("throttled")->Value();
  auto st = client->Stat("prefix/obj");
  INFO(st.status().ToString());
  REQUIRE(st.ok());
  CHECK(st->size == kSize);
  CHECK(st->etag == "\"v1\"");
  CHECK(RetriesCounter("throttled")->Value() - throttled == 3);
  auto r = client->ReadRange("prefix/obj", 5, 10, st->etag, st->size);
  REQUIRE(r.ok());
  CHECK(*r == Expected(5, 10));
}

TEST_CASE("throttling that outlasts the attempts is Unavailable saying so", "[objstore][faults]") {
  testing::FaultServer server("slowdown:100", kSize);
  auto client = OpenClient(server, 2);
  auto r = client->ReadRange("prefix/obj", 0, 10);
  REQUIRE(r.status().code() == StatusCode::kUnavailable);
  CHECK_THAT(r.status().message(), Catch::Contains("503 SlowDown"));
  CHECK_THAT(r.status().message(), Catch::Contains("gave up after 2 attempts"));
}

TEST_CASE("SignatureDoesNotMatch is PermissionDenied at once, without the secret", "[objstore][faults]") {
  testing::FaultServer server("signature", kSize);
  auto client = OpenClient(server);
  auto r = client->ReadRange("prefix/obj", 0, 10);
  REQUIRE(r.status().code() == StatusCode::kPermissionDenied);
  CHECK_THAT(r.status().message(), Catch::Contains("SignatureDoesNotMatch"));
  CHECK_THAT(r.status().message(), Catch::Contains("access key id AKIDEXAMPLE"));
  CHECK_THAT(r.status().message(), !Catch::Contains("NotThePrintedSecret"));
  CHECK(Count(server.RequestLog(), "GET ") == 1);
}

TEST_CASE("libcurl's SigV4 signatures verify with botocore's signer; a wrong secret is named", "[objstore][faults]") {
  testing::FaultServer server("sigv4:RightSecret/With+Chars=", kSize);
  ObjectStoreOptions o;
  o.endpoint = server.endpoint();
  o.credentials = {"AKIDEXAMPLE", "RightSecret/With+Chars=", "SessionToken+/=", ""};
  auto good = ObjectClient::Open(*ParseObjectUri("s3://bucket/prefix"), o);
  REQUIRE(good.ok());
  auto read = (*good)->ReadRange("prefix/a b+c&d=e.bin", 3, 100);
  INFO(read.status().ToString() << "\n" << server.RequestLog());
  REQUIRE(read.ok());
  CHECK(*read == Expected(3, 100));
  REQUIRE((*good)->Stat("prefix/obj").ok());
  // Over 1 MiB: curl adds "Expect: 100-continue" itself, outside the signed headers.
  auto put = (*good)->Put("prefix/new object", std::string(1536 * 1024, 'x'));
  INFO(put.status().ToString());
  CHECK(put.ok());
  auto list = (*good)->List("prefix/a b&c=d/");
  INFO(list.status().ToString());
  REQUIRE(list.ok());
  CHECK(list->size() == 1);

  o.credentials.secret_access_key = "WrongSecretValue";
  auto bad = ObjectClient::Open(*ParseObjectUri("s3://bucket/prefix"), o);
  REQUIRE(bad.ok());
  for (const Status& s : {(*bad)->ReadRange("prefix/obj", 0, 10).status(), (*bad)->List("prefix/").status(),
                          (*bad)->Stat("prefix/obj").status()}) {
    REQUIRE(s.code() == StatusCode::kPermissionDenied);
    CHECK_THAT(s.message(), Catch::StartsWith("credentials refused by " + server.endpoint() + " for bucket bucket"));
    CHECK_THAT(s.message(), !Catch::Contains("WrongSecretValue"));
    CHECK_THAT(s.message(), !Catch::Contains("SessionToken"));
  }
}

TEST_CASE("an endpoint nobody listens on is Unavailable after the retries, naming it", "[objstore][faults]") {
  ObjectStoreOptions o;
  o.endpoint = "http://127.0.0.1:" + std::to_string(shardcache::testing::FreePort());
  o.max_attempts = 2;
  o.backoff_initial_ms = 5;
  auto client = ObjectClient::Open(*ParseObjectUri("s3://bucket"), o);
  REQUIRE(client.ok());
  auto r = (*client)->ReadRange("obj", 0, 10);
  REQUIRE(r.status().code() == StatusCode::kUnavailable);
  CHECK_THAT(r.status().message(), Catch::StartsWith("connection to " + o.endpoint + " failed during GET s3://bucket/obj"));
  CHECK_THAT(r.status().message(), Catch::Contains("gave up after 2 attempts"));
}

TEST_CASE("Shutdown ends reads in flight with Cancelled at once, and later ones too", "[objstore][faults]") {
  testing::FaultServer server("delay:3000", kSize);
  auto client = OpenClient(server);
  std::vector<RangeRead> ranges(4, RangeRead{"prefix/obj", 0, 100});
  std::vector<Result<std::string>> results;
  const auto start = std::chrono::steady_clock::now();
  std::thread reader([&] { results = client->ReadRanges(ranges); });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  client->Shutdown();
  reader.join();
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::milliseconds(2000));
  REQUIRE(results.size() == 4);
  for (const auto& r : results) CHECK(r.status().code() == StatusCode::kCancelled);
  CHECK(client->ReadRange("prefix/obj", 0, 10).status().code() == StatusCode::kCancelled);
  client->Shutdown();  // idempotent
}

// The ports the server saw requests come from: one per connection.
std::set<std::string> ClientPorts(const std::string& log) {
  std::set<std::string> ports;
  for (size_t p = log.find("port="); p != std::string::npos; p = log.find("port=", p + 1)) {
    ports.insert(log.substr(p + 5, log.find('\n', p) - p - 5));
  }
  return ports;
}

TEST_CASE("ranged reads run in parallel up to the connection cap and reuse connections", "[objstore][faults]") {
  testing::FaultServer server("delay:200", kSize);
  ObjectStoreOptions o;
  o.endpoint = server.endpoint();
  o.max_connections = 4;
  auto client = ObjectClient::Open(*ParseObjectUri("s3://bucket"), o);
  REQUIRE(client.ok());
  std::vector<RangeRead> ranges;
  for (uint64_t i = 0; i < 16; ++i) ranges.push_back(RangeRead{"obj", i * 1000, 1000});
  for (int round = 0; round < 2; ++round) {
    const auto start = std::chrono::steady_clock::now();
    auto results = (*client)->ReadRanges(ranges);
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start);
    for (size_t i = 0; i < results.size(); ++i) {
      REQUIRE(results[i].ok());
      CHECK(*results[i] == Expected(ranges[i].offset, ranges[i].length));
    }
    // 16 reads of 200 ms each on 4 connections: 4 rounds, not 16 (serial) nor 1 (uncapped).
    CHECK(ms.count() >= 780);
    CHECK(ms.count() < 2400);
  }
  INFO(server.RequestLog());
  // Both batches used the same 4 connections.
  CHECK(ClientPorts(server.RequestLog()).size() == 4);
}

TEST_CASE("an urgent read begins before queued reads that are not (a demand read behind warm reads)",
          "[objstore][faults]") {
  testing::FaultServer server("delay:200", kSize);
  ObjectStoreOptions o;
  o.endpoint = server.endpoint();
  o.max_connections = 2;
  auto client = ObjectClient::Open(*ParseObjectUri("s3://bucket"), o);
  REQUIRE(client.ok());
  using Clock = std::chrono::steady_clock;
  std::promise<Clock::time_point> urgent_done, last_done;
  std::atomic<int> left{8};
  const auto start = Clock::now();
  for (uint64_t i = 0; i < 8; ++i) {
    (*client)->ReadRangeAsync(RangeRead{"obj", i * 1000, 1000}, [&](Result<std::string> r) {
      CHECK(r.ok());
      if (--left == 0) last_done.set_value(Clock::now());
    });
  }
  RangeRead urgent{"obj", 50000, 1000};
  urgent.urgent = true;
  (*client)->ReadRangeAsync(urgent, [&](Result<std::string> r) {
    CHECK(r.ok());
    if (r.ok()) CHECK(*r == Expected(50000, 1000));
    urgent_done.set_value(Clock::now());
  });
  const auto urgent_ms = std::chrono::duration_cast<std::chrono::milliseconds>(urgent_done.get_future().get() - start);
  const auto last_ms = std::chrono::duration_cast<std::chrono::milliseconds>(last_done.get_future().get() - start);
  // 9 reads of 200 ms on 2 connections: the urgent one in the second round (a queued one would
  // be in the fifth, with the last of the others), the others up to the fifth. Compared with
  // each other, so that a slow machine slows both.
  INFO("urgent " << urgent_ms.count() << " ms, last other " << last_ms.count() << " ms");
  CHECK(urgent_ms.count() + 300 < last_ms.count());
  CHECK(last_ms.count() >= 780);
}

TEST_CASE("a multipart upload's requests verify with botocore's signer and complete with the parts' ETags",
          "[objstore][faults]") {
  testing::FaultServer server("sigv4:RightSecret/With+Chars=", kSize);
  auto client = OpenClient(server, 4, "RightSecret/With+Chars=");
  shardcache::testing::TempDir tmp;
  const std::string big = tmp.path() + "/big", small = tmp.path() + "/small";
  REQUIRE(WriteFileAtomic(big, std::string(2 * ObjectClient::kMinPartBytes + 5, 'b')).ok());
  REQUIRE(WriteFileAtomic(small, std::string(1000, 's')).ok());

  auto etag = client->PutFile("prefix/big file", big, ObjectClient::kMinPartBytes);
  INFO(etag.status().ToString() << "\n" << server.RequestLog());
  REQUIRE(etag.ok());
  CHECK(*etag == "\"whole-3\"");  // CompleteMultipartUpload's answer
  const std::string log = server.RequestLog();
  CHECK(Count(log, "POST /bucket/prefix/big%20file?uploads=") == 1);
  for (int part = 1; part <= 3; ++part) {
    CHECK(Count(log, "PUT /bucket/prefix/big%20file?partNumber=" + std::to_string(part) + "&uploadId=up%2Bload%2F1") == 1);
  }
  CHECK(Count(log, "POST /bucket/prefix/big%20file?uploadId=up%2Bload%2F1") == 1);
  CHECK(Count(log, "DELETE") == 0);

  // Up to one part: one PUT.
  REQUIRE(client->PutFile("prefix/small", small, ObjectClient::kMinPartBytes).ok());
  CHECK(Count(server.RequestLog(), "PUT /bucket/prefix/small ") == 1);
  CHECK(client->PutFile("prefix/x", small, 1 << 20).status().code() == StatusCode::kInvalidArgument);
  CHECK(client->PutFile("prefix/x", tmp.path() + "/absent").status().code() == StatusCode::kNotFound);
}

TEST_CASE("a refused part aborts the multipart upload with an error naming the object and the part",
          "[objstore][faults]") {
  testing::FaultServer server("partfail", kSize);
  auto client = OpenClient(server);
  shardcache::testing::TempDir tmp;
  const std::string big = tmp.path() + "/big";
  REQUIRE(WriteFileAtomic(big, std::string(3 * ObjectClient::kMinPartBytes, 'b')).ok());
  auto etag = client->PutFile("prefix/shard-0.bin", big, ObjectClient::kMinPartBytes);
  REQUIRE_FALSE(etag.ok());
  CHECK(etag.status().code() == StatusCode::kPermissionDenied);
  CHECK_THAT(etag.status().message(), Catch::Contains("part 2 of the multipart upload"));
  CHECK_THAT(etag.status().message(), Catch::Contains("prefix/shard-0.bin"));
  const std::string log = server.RequestLog();
  CHECK(Count(log, "partNumber=3") == 0);  // stopped at the refused part
  CHECK(Count(log, "DELETE /bucket/prefix/shard-0.bin?uploadId=up%2Bload%2F1") == 1);
}

}  // namespace
}  // namespace shardcache::objstore
