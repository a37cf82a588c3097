#include "daemon/upstream/upstream_uri.h"

#include <catch2/catch.hpp>

namespace shardcache::upstream {
namespace {

TEST_CASE("upstream URIs are checked for scheme, absolute path and port", "[upstream]") {
  CHECK(ParseUpstreamUri("file:///srv/data/")->path == "/srv/data");
  CHECK(ParseUpstreamUri("grpc://origin:7443")->target == "origin:7443");
  CHECK(ParseUpstreamUri("grpcs://[::1]:7443")->scheme == UpstreamUri::Scheme::kGrpcs);
  CHECK_FALSE(ParseUpstreamUri("file://relative").ok());
  CHECK_FALSE(ParseUpstreamUri("grpc://origin").ok());
  CHECK_FALSE(ParseUpstreamUri("grpc://origin:99999").ok());
  CHECK_FALSE(ParseUpstreamUri("grpc://origin:7443/path").ok());
  CHECK_FALSE(ParseUpstreamUri("s3://Not_A_Bucket").ok());
  CHECK_FALSE(ParseUpstreamUri("gs://bucket").ok());
}

TEST_CASE("object-storage upstreams are kept as written for objstore", "[upstream]") {
  auto s3 = ParseUpstreamUri("s3://bucket/datasets");
  REQUIRE(s3.ok());
  CHECK(s3->scheme == UpstreamUri::Scheme::kObject);
  CHECK(s3->object == "s3://bucket/datasets");
  CHECK(ParseUpstreamUri("https://data.example.org/pub")->scheme == UpstreamUri::Scheme::kObject);
  CHECK_THAT(ParseUpstreamUri("https://host/a/../b").status().message(), Catch::Contains("'..'"));
}

TEST_CASE("an upstream URI's scheme says whether the link uses TLS", "[upstream]") {
  CHECK_FALSE(ParseUpstreamUri("grpc://origin:7443")->tls());
  CHECK(ParseUpstreamUri("grpcs://origin:7443")->tls());
  CHECK(ParseUpstreamUri("file:///").value().path == "/");
}

}  // namespace
}  // namespace shardcache::upstream
