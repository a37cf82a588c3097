// ObjectClient against nginx serving a directory over http:// and https:// on loopback.
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "common/random.h"
#include "objstore/object_client.h"
#include "objstore/test_servers.h"
#include "testing/temp_dir.h"

namespace shardcache::objstore {
namespace {

using testing::OpenClient;

std::string Pattern(size_t n, uint64_t seed) {
  SplitMix64 rng(seed);
  std::string s(n, '\0');
  for (auto& c : s) c = static_cast<char>(rng.Next());
  return s;
}

void WriteFile(const std::string& path, const std::string& data) {
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  std::ofstream(path, std::ios::binary) << data;
}

TEST_CASE("files served by nginx over http and https are read byte-exact in ranges", "[objstore][nginx]") {
  shardcache::testing::TempDir root;
  const std::string data = Pattern(2 * 1024 * 1024 + 3, 7);
  WriteFile(root / "pub/sets/shard-0.bin", data);
  testing::Nginx nginx(root.path());
  ObjectStoreOptions o;
  o.max_connections = 4;
  o.ca_file = nginx.ca_file();
  for (const std::string& origin : {nginx.http_origin(), nginx.https_origin()}) {
    INFO(origin);
    auto client = OpenClient(origin + "/pub/sets", o);
    const std::string key = client->uri().Key("shard-0.bin");
    auto st = client->Stat(key);
    INFO(st.status().ToString());
    REQUIRE(st.ok());
    CHECK(st->size == data.size());
    CHECK_FALSE(st->etag.empty());
    std::vector<RangeRead> ranges;
    for (uint64_t off = 0; off < data.size(); off += 65536) {
      ranges.push_back(RangeRead{key, off, std::min<uint64_t>(65536, data.size() - off), st->etag, st->size});
    }
    auto results = client->ReadRanges(ranges);
    std::string joined;
    for (auto& r : results) {
      INFO(r.status().ToString());
      REQUIRE(r.ok());
      joined += *r;
    }
    CHECK(joined == data);
    auto missing = client->Stat(client->uri().Key("nope.bin"));
    CHECK(missing.status().code() == StatusCode::kNotFound);
    CHECK_THAT(missing.status().message(), Catch::Contains(origin + "/pub/sets/nope.bin does not exist"));
    CHECK(client->List("pub/sets").status().code() == StatusCode::kUnimplemented);
    CHECK(client->Put(key, "x").status().code() == StatusCode::kUnimplemented);
  }
}

TEST_CASE("https with a certificate the CA bundle does not vouch for fails at once, unretried", "[objstore][nginx]") {
  shardcache::testing::TempDir root;
  WriteFile(root / "f.bin", "hello");
  testing::Nginx nginx(root.path());
  ObjectStoreOptions o;  // the system's CA bundle: the self-signed certificate is not in it
  o.backoff_initial_ms = 1000;
  auto client = OpenClient(nginx.https_origin(), o);
  const auto start = std::chrono::steady_clock::now();
  auto st = client->Stat("f.bin");
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::milliseconds(900));
  REQUIRE(st.status().code() == StatusCode::kFailedPrecondition);
  CHECK_THAT(st.status().message(), Catch::Contains(nginx.https_origin()));
  CHECK_THAT(st.status().message(), Catch::Contains("check the CA bundle"));
  o.verify_tls = false;
  CHECK(OpenClient(nginx.https_origin(), o)->Stat("f.bin").ok());
}

TEST_CASE("a file replaced after Stat is refused by If-Match and named", "[objstore][nginx]") {
  shardcache::testing::TempDir root;
  WriteFile(root / "d/shard.bin", Pattern(50000, 8));
  testing::Nginx nginx(root.path());
  auto client = OpenClient(nginx.http_origin(), ObjectStoreOptions{});
  auto st = client->Stat("d/shard.bin");
  REQUIRE(st.ok());
  WriteFile(root / "d/shard.bin", Pattern(60000, 9));
  auto read = client->ReadRange("d/shard.bin", 0, 1000, st->etag, st->size);
  REQUIRE(read.status().code() == StatusCode::kFailedPrecondition);
  CHECK_THAT(read.status().message(),
             Catch::StartsWith("object " + nginx.http_origin() + "/d/shard.bin changed since it was indexed (ETag " +
                               st->etag));
}

}  // namespace
}  // namespace shardcache::objstore
