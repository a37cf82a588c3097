// ObjectClient against s3rver, a real S3-protocol server on loopback.
#include <algorithm>
#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "common/random.h"
#include "objstore/object_client.h"
#include "objstore/objstore_metrics.h"
#include "objstore/test_servers.h"
#include "common/fs.h"
#include "testing/temp_dir.h"

namespace shardcache::objstore {
namespace {

using testing::OpenClient;

constexpr char kSecret[] = "S3RVER";

std::string RandomBytes(size_t n, uint64_t seed) {
  SplitMix64 rng(seed);
  std::string s(n, '\0');
  for (auto& c : s) c = static_cast<char>(rng.Next());
  return s;
}

ObjectStoreOptions S3rverOptions(const testing::S3rver& server) {
  ObjectStoreOptions o;
  o.endpoint = server.endpoint();
  o.credentials = {"S3RVER", kSecret, "", ""};
  o.max_connections = 8;
  o.backoff_initial_ms = 10;
  return o;
}

TEST_CASE("objects put to s3rver are listed, stat'ed and read back byte-exact in ranges", "[objstore][s3rver]") {
  testing::S3rver server;
  auto client = OpenClient("s3://test-bucket/sets/one", S3rverOptions(server));
  const std::string big = RandomBytes(3 * 1024 * 1024 + 17, 1);
  const std::string small = RandomBytes(1000, 2);
  auto etag = client->Put(client->uri().Key("shards/a b+c.bin"), big);
  INFO(etag.status().ToString());
  REQUIRE(etag.ok());
  REQUIRE(client->Put(client->uri().Key(".shardcache/manifest.pb"), small).ok());
  REQUIRE(client->Put("elsewhere/x", small).ok());

  auto list = client->List(client->uri().Key(""));
  REQUIRE(list.ok());
  REQUIRE(list->size() == 2);
  CHECK((*list)[0].key == "sets/one/.shardcache/manifest.pb");
  CHECK((*list)[1].key == "sets/one/shards/a b+c.bin");
  CHECK((*list)[1].size == big.size());
  CHECK((*list)[1].etag == *etag);

  auto st = client->Stat("sets/one/shards/a b+c.bin");
  REQUIRE(st.ok());
  CHECK(st->size == big.size());
  CHECK(st->etag == *etag);

  auto whole = client->ReadRange("sets/one/shards/a b+c.bin", 0, big.size(), st->etag, st->size);
  REQUIRE(whole.ok());
  CHECK(*whole == big);
  auto tail = client->ReadRange("sets/one/shards/a b+c.bin", big.size() - 5, 5, st->etag, st->size);
  REQUIRE(tail.ok());
  CHECK(*tail == big.substr(big.size() - 5));
  CHECK(client->ReadRange("sets/one/shards/a b+c.bin", 7, 0)->empty());
  auto past = client->ReadRange("sets/one/shards/a b+c.bin", big.size() - 5, 10);
  REQUIRE(past.status().code() == StatusCode::kOutOfRange);
  CHECK_THAT(past.status().message(), Catch::Contains("reach past the end of s3://test-bucket/sets/one/shards/a b+c.bin"));
  CHECK(client->ReadRange("sets/one/shards/a b+c.bin", big.size() + 5, 10).status().code() ==
        StatusCode::kOutOfRange);
  auto got = client->Get("sets/one/.shardcache/manifest.pb");
  REQUIRE(got.ok());
  CHECK(got->bytes == small);
  CHECK_FALSE(got->etag.empty());
}

TEST_CASE("virtual-host addressing names the bucket in the host", "[objstore][s3rver]") {
  testing::S3rver server("test-bucket", "localhost");
  ObjectStoreOptions o = S3rverOptions(server);
  // curl resolves every *.localhost name to the loopback address itself.
  o.endpoint = "http://s3.localhost:" + std::to_string(server.port());
  o.addressing = "virtual";
  auto client = OpenClient("s3://test-bucket/v", o);
  REQUIRE(client->Put("v/obj", "virtual bytes").ok());
  auto list = client->List("v/");
  REQUIRE(list.ok());
  REQUIRE(list->size() == 1);
  CHECK((*list)[0].key == "v/obj");
  auto r = client->ReadRange("v/obj", 8, 5);
  INFO(r.status().ToString());
  REQUIRE(r.ok());
  CHECK(*r == "bytes");
  // The same object through path-style addressing: it is the same bucket.
  auto path_style = OpenClient("s3://test-bucket", S3rverOptions(server));
  CHECK(*path_style->ReadRange("v/obj", 0, 7) == "virtual");
}

TEST_CASE("a listing follows continuation tokens across pages", "[objstore][s3rver]") {
  testing::S3rver server;
  ObjectStoreOptions o = S3rverOptions(server);
  o.list_page_keys = 3;
  auto client = OpenClient("s3://test-bucket", o);
  std::vector<std::string> keys;
  for (int i = 0; i < 10; ++i) keys.push_back("p/shard-" + std::to_string(i) + (i % 2 ? "" : " odd&name"));
  for (const auto& k : keys) REQUIRE(client->Put(k, k).ok());
  REQUIRE(client->Put("q/other", "x").ok());
  const uint64_t lists_before = RequestsCounter("list")->Value();
  auto list = client->List("p/");
  INFO(list.status().ToString());
  REQUIRE(list.ok());
  std::sort(keys.begin(), keys.end());
  std::vector<std::string> got;
  for (const auto& o : *list) got.push_back(o.key);
  CHECK(got == keys);
  CHECK(RequestsCounter("list")->Value() - lists_before == 4);
}

TEST_CASE("many ranged reads run concurrently and each gets its own bytes", "[objstore][s3rver]") {
  testing::S3rver server;
  auto client = OpenClient("s3://test-bucket", S3rverOptions(server));
  const std::string data = RandomBytes(8 * 1024 * 1024, 3);
  REQUIRE(client->Put("big", data).ok());
  auto st = client->Stat("big");
  REQUIRE(st.ok());
  std::vector<RangeRead> ranges;
  SplitMix64 rng(4);
  for (int i = 0; i < 200; ++i) {
    const uint64_t len = 1 + rng.Below(256 * 1024);
    const uint64_t off = rng.Below(data.size() - len + 1);
    ranges.push_back(RangeRead{"big", off, len, st->etag, st->size});
  }
  const uint64_t bytes_before = ReadBytesCounter()->Value();
  auto results = client->ReadRanges(ranges);
  REQUIRE(results.size() == ranges.size());
  uint64_t total = 0;
  for (size_t i = 0; i < results.size(); ++i) {
    INFO("range " << i << ": " << results[i].status().ToString());
    REQUIRE(results[i].ok());
    CHECK(*results[i] == data.substr(ranges[i].offset, ranges[i].length));
    total += ranges[i].length;
  }
  CHECK(ReadBytesCounter()->Value() - bytes_before == total);

  // The same ranges into the caller's buffers.
  std::vector<std::string> buffers;
  for (auto& r : ranges) buffers.emplace_back(r.length, '\0');
  for (size_t i = 0; i < ranges.size(); ++i) ranges[i].dest = reinterpret_cast<uint8_t*>(buffers[i].data());
  auto direct = client->ReadRanges(ranges);
  for (size_t i = 0; i < ranges.size(); ++i) {
    REQUIRE(direct[i].ok());
    CHECK(direct[i]->empty());
    CHECK(buffers[i] == data.substr(ranges[i].offset, ranges[i].length));
  }
}

TEST_CASE("a missing bucket and a missing object are NotFound naming them and the endpoint", "[objstore][s3rver]") {
  testing::S3rver server;
  auto nobucket = OpenClient("s3://no-such-bucket/p", S3rverOptions(server));
  auto list = nobucket->List("p/");
  REQUIRE(list.status().code() == StatusCode::kNotFound);
  CHECK(list.status().message().rfind("bucket no-such-bucket does not exist at " + server.endpoint(), 0) == 0);
  auto st = nobucket->Stat("p/x");
  CHECK(st.status().code() == StatusCode::kNotFound);
  CHECK_THAT(st.status().message(), Catch::Contains("bucket no-such-bucket does not exist"));
  auto read = nobucket->ReadRange("p/x", 0, 10);
  CHECK_THAT(read.status().message(), Catch::Contains("bucket no-such-bucket does not exist"));

  auto client = OpenClient("s3://test-bucket", S3rverOptions(server));
  auto missing = client->Stat("nope/obj");
  REQUIRE(missing.status().code() == StatusCode::kNotFound);
  CHECK_THAT(missing.status().message(), Catch::Contains("object s3://test-bucket/nope/obj does not exist at"));
  CHECK(client->ReadRange("nope/obj", 0, 4).status().code() == StatusCode::kNotFound);
}

TEST_CASE("wrong credentials are PermissionDenied naming endpoint and bucket, never the secret", "[objstore][s3rver]") {
  testing::S3rver server;
  ObjectStoreOptions o = S3rverOptions(server);
  o.credentials = {"WRONGKEY", "TopSecretValue42", "", ""};
  auto client = OpenClient("s3://test-bucket", o);
  const uint64_t before = ErrorsCounter("permission")->Value();
  for (const Status& s : {client->Put("k", "v").status(), client->List("").status(), client->ReadRange("k", 0, 1).status()}) {
    REQUIRE(s.code() == StatusCode::kPermissionDenied);
    CHECK_THAT(s.message(), Catch::StartsWith("credentials refused by " + server.endpoint() + " for bucket test-bucket"));
    CHECK_THAT(s.message(), Catch::Contains("InvalidAccessKeyId"));
    CHECK_THAT(s.message(), !Catch::Contains("TopSecretValue42"));
  }
  CHECK(ErrorsCounter("permission")->Value() - before == 3);
}

TEST_CASE("an object rewritten after Stat is a named error, never a mix of versions", "[objstore][s3rver]") {
  testing::S3rver server;
  auto client = OpenClient("s3://test-bucket", S3rverOptions(server));
  const std::string v1 = RandomBytes(100000, 5), v2 = RandomBytes(100000, 6);
  REQUIRE(client->Put("data/shard-0", v1).ok());
  auto st = client->Stat("data/shard-0");
  REQUIRE(st.ok());
  REQUIRE(client->Put("data/shard-0", v2).ok());
  auto read = client->ReadRange("data/shard-0", 10, 5000, st->etag, st->size);
  REQUIRE(read.status().code() == StatusCode::kFailedPrecondition);
  CHECK_THAT(read.status().message(), Catch::StartsWith("object s3://test-bucket/data/shard-0 changed since it was indexed (ETag " + st->etag + " -> "));
  CHECK_THAT(read.status().message(), Catch::Contains("re-run shardctl index"));
  // A changed size is named too.
  REQUIRE(client->Put("data/shard-0", v2.substr(0, 50)).ok());
  auto shorter = client->ReadRange("data/shard-0", 0, 10, "", st->size);
  REQUIRE(shorter.status().code() == StatusCode::kFailedPrecondition);
  CHECK_THAT(shorter.status().message(), Catch::Contains("size 100000 -> 50"));
}

TEST_CASE("a file larger than a part is stored by a multipart upload and reads back byte-exact",
          "[objstore][s3rver]") {
  testing::S3rver server;
  auto client = OpenClient("s3://test-bucket/sets/mp", S3rverOptions(server));
  shardcache::testing::TempDir tmp;
  const std::string bytes = RandomBytes(2 * ObjectClient::kMinPartBytes + 12345, 7);
  REQUIRE(WriteFileAtomic(tmp.path() + "/shard", bytes).ok());
  auto etag = client->PutFile(client->uri().Key("shard-0.bin"), tmp.path() + "/shard", ObjectClient::kMinPartBytes);
  INFO(etag.status().ToString());
  REQUIRE(etag.ok());
  auto st = client->Stat("sets/mp/shard-0.bin");
  REQUIRE(st.ok());
  CHECK(st->size == bytes.size());
  CHECK(st->etag == *etag);
  auto back = client->Get("sets/mp/shard-0.bin");
  REQUIRE(back.ok());
  CHECK(back->bytes == bytes);
}

}  // namespace
}  // namespace shardcache::objstore
