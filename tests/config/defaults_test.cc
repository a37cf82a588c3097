// A key the operator leaves out gives each component its own default: the options the daemon
// builds from a minimal config equal the components' default-constructed options in every
// field the config translates. A default restated in config/ (or in a translation) with a
// different value fails here.
#include <catch2/catch.hpp>

#include "config/config.h"
#include "daemon/component_options.h"
#include "daemon/serve/loader_pipeline.h"

namespace shardcache::daemon {
namespace {

config::Config Minimal(const std::string& upstream) {
  auto c = config::ParseConfig("upstream = \"" + upstream + "\"\n");
  REQUIRE(c.ok());
  return *c;
}

TEST_CASE("the cache tier gets the cache's own defaults, apart from the systemd directory", "[config]") {
  cache::CacheOptions expected;
  expected.dir = config::kDefaultCacheDir;
  CHECK(Minimal("file:///srv").cache == expected);
}

TEST_CASE("the upstream client gets GrpcSource's own defaults", "[config]") {
  const config::Config c = Minimal("grpcs://origin.example:7443");
  const upstream::GrpcSourceOptions got = GrpcSourceOptionsFor(c, *upstream::ParseUpstreamUri(c.upstream));
  const upstream::GrpcSourceOptions want;
  CHECK(got.target == "origin.example:7443");
  CHECK(got.tls);
  CHECK(got.connections == want.connections);
  CHECK(got.max_connections == want.max_connections);
  CHECK(got.bandwidth_bytes_per_s == want.bandwidth_bytes_per_s);
  CHECK(got.call_timeout == want.call_timeout);
  CHECK(got.outage_timeout == want.outage_timeout);
  CHECK(got.max_retries == want.max_retries);
  CHECK(got.ca == want.ca);
  CHECK(got.token == want.token);
}

TEST_CASE("an object-storage upstream gets ObjectClient's own defaults", "[config]") {
  CHECK(Minimal("s3://bucket/prefix").objstore == objstore::ObjectStoreOptions{});
}

TEST_CASE("the local service and its loaders get their own defaults", "[config]") {
  config::Config c = Minimal("file:///srv");
  const serve::LocalServiceOptions got = LocalServiceOptionsFor(c);
  const serve::LocalServiceOptions want;
  CHECK(got.socket_path == want.socket_path);
  CHECK(got.max_connections == want.max_connections);
  CHECK(got.arena_bytes == want.arena_bytes);
  CHECK(got.slot_count == want.slot_count);
  CHECK(got.allowed_uids == want.allowed_uids);
  CHECK(got.allowed_gids == want.allowed_gids);
  // With the default DRAM tier (and no NVMe tier) the lookahead is capped at an eighth of it.
  CHECK(got.prefetch_lookahead_bytes == c.cache.memory_bytes / 8);
  // A daemon without cache tiers keeps the configured lookahead: the loaders' own default.
  c.cache.memory_bytes = 0;
  CHECK(LocalServiceOptionsFor(c).prefetch_lookahead_bytes == want.prefetch_lookahead_bytes);
  CHECK(want.prefetch_lookahead_bytes == serve::LoaderPipelineOptions{}.lookahead_bytes);
}

TEST_CASE("the origin and admin servers get their own defaults", "[config]") {
  const config::Config c = Minimal("file:///srv");
  CHECK(AdminOptionsFor(c).listen == admin::AdminOptions{}.listen);
  const serve::ServerOptions got = OriginServerOptionsFor(c);
  CHECK(got.listen.empty());
  CHECK(got.require_client_cert == serve::ServerOptions{}.require_client_cert);
  CHECK(got.token.empty());
}

}  // namespace
}  // namespace shardcache::daemon
