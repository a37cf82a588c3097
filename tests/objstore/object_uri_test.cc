#include "objstore/object_uri.h"

#include <catch2/catch.hpp>

namespace shardcache::objstore {
namespace {

TEST_CASE("s3:// URIs give a bucket and a prefix without slashes at either end", "[objstore]") {
  auto u = ParseObjectUri("s3://my-bucket/datasets/laion/");
  REQUIRE(u.ok());
  CHECK(u->is_s3());
  CHECK(u->bucket == "my-bucket");
  CHECK(u->prefix == "datasets/laion");
  CHECK(u->Key("train/manifest.pb") == "datasets/laion/train/manifest.pb");
  CHECK(u->Describe(u->Key("a")) == "s3://my-bucket/datasets/laion/a");
  auto bare = ParseObjectUri("s3://my-bucket");
  REQUIRE(bare.ok());
  CHECK(bare->prefix.empty());
  CHECK(bare->Key("x/y") == "x/y");
}

TEST_CASE("http(s):// URIs keep scheme, host and port as the origin", "[objstore]") {
  auto u = ParseObjectUri("https://data.example.org:8443/pub/sets");
  REQUIRE(u.ok());
  CHECK(u->scheme == ObjectUri::Scheme::kHttps);
  CHECK(u->origin == "https://data.example.org:8443");
  CHECK(u->prefix == "pub/sets");
  CHECK(u->Describe("pub/sets/a.tar") == "https://data.example.org:8443/pub/sets/a.tar");
  CHECK(ParseObjectUri("http://127.0.0.1:8080")->scheme == ObjectUri::Scheme::kHttp);
}

TEST_CASE("bad object URIs are InvalidArgument saying what is wrong", "[objstore]") {
  auto msg = [](const std::string& uri) {
    auto r = ParseObjectUri(uri);
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == StatusCode::kInvalidArgument);
    return r.status().message();
  };
  CHECK_THAT(msg("gs://bucket/x"), Catch::Contains("not an object-storage URI"));
  CHECK_THAT(msg("s3://My_Bucket/x"), Catch::Contains("not a valid bucket name"));
  CHECK_THAT(msg("s3://ab"), Catch::Contains("not a valid bucket name"));
  CHECK_THAT(msg("s3://bucket/a/../b"), Catch::Contains("'..'"));
  CHECK_THAT(msg("s3://bucket/a//b"), Catch::Contains("empty"));
  CHECK_THAT(msg("https:///path"), Catch::Contains("needs a host"));
  CHECK_THAT(msg("https://user@host/path"), Catch::Contains("needs a host"));
  CHECK_THAT(msg("https://host/path?x=1"), Catch::Contains("query"));
  CHECK_THAT(msg("ftp://host/x"), Catch::Contains("s3://BUCKET/PREFIX"));
}

}  // namespace
}  // namespace shardcache::objstore
