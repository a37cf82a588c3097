#include "daemon/component_options.h"

#include <algorithm>

#include "common/host_port.h"

namespace shardcache::daemon {

upstream::GrpcSourceOptions GrpcSourceOptionsFor(const config::Config& c, const upstream::UpstreamUri& uri) {
  upstream::GrpcSourceOptions o;
  o.target = uri.target;
  o.tls = uri.tls();
  o.ca = c.tls.ca;
  o.cert = c.tls.cert;
  o.key = c.tls.key;
  o.token = c.auth.token;
  o.connections = static_cast<int>(c.fetch.connections);
  o.max_connections = static_cast<int>(c.fetch.max_connections);
  o.bandwidth_bytes_per_s = c.fetch.bandwidth_bytes_per_s;
  o.call_timeout = c.fetch.timeout;
  o.outage_timeout = c.fetch.outage_timeout;
  o.max_retries = static_cast<int>(c.fetch.retries);
  o.max_in_flight_bytes = c.fetch.max_in_flight_bytes;
  return o;
}

upstream::PeerGroupOptions PeerGroupOptionsFor(const config::Config& c) {
  upstream::PeerGroupOptions o;
  o.members.members = c.peers.members;
  o.members.dns = c.peers.dns;
  o.members.self = c.peers.self;
  std::string host;
  if (!c.listen.origin.empty() && !SplitHostPort(c.listen.origin, &host, &o.members.origin_port).ok()) {
    o.members.origin_port = 0;
  }
  o.refresh = c.peers.refresh;
  o.timeout = c.peers.timeout;
  upstream::GrpcSourceOptions& g = o.connection;
  g.tls = !c.tls.cert.empty();  // members serve what this daemon serves
  g.ca = c.tls.ca;
  g.cert = c.tls.cert;
  g.key = c.tls.key;
  g.token = c.auth.token;
  g.connections = 4;
  g.max_connections = static_cast<int>(std::min<uint32_t>(c.fetch.max_connections, 64));
  g.call_timeout = c.fetch.timeout;
  g.max_retries = static_cast<int>(c.fetch.retries);
  g.max_in_flight_bytes = c.fetch.max_in_flight_bytes;
  return o;
}

uint64_t LoaderLookahead(const config::Config& c) {
  const uint64_t cache = c.cache.size_bytes + c.cache.memory_bytes;
  if (cache == 0) return c.fetch.prefetch_bytes;
  return std::min<uint64_t>(c.fetch.prefetch_bytes, cache / 8);
}

serve::LocalServiceOptions LocalServiceOptionsFor(const config::Config& c) {
  serve::LocalServiceOptions o;
  o.socket_path = c.listen.socket;
  o.allowed_uids = c.local.allowed_uids;
  o.allowed_gids = c.local.allowed_gids;
  o.allowed_groups = c.local.allowed_groups;
  o.max_connections = c.local.max_connections;
  o.arena_bytes = c.local.arena_size_bytes;
  o.slot_count = c.local.slots;
  o.prefetch_lookahead_bytes = LoaderLookahead(c);
  return o;
}

serve::ServerOptions OriginServerOptionsFor(const config::Config& c) {
  serve::ServerOptions o;
  o.listen = c.listen.origin;
  o.tls_cert = c.tls.cert;
  o.tls_key = c.tls.key;
  o.tls_ca = c.tls.ca;
  o.require_client_cert = c.tls.require_client_cert;
  o.token = c.auth.token;
  return o;
}

serve::OriginServiceOptions OriginServiceOptionsFor(const config::Config& c) {
  serve::OriginServiceOptions o;
  o.checkpoints.root = c.checkpoints.root;
  for (const auto& w : c.checkpoints.writers) o.checkpoints.writers.push_back({w.prefix, w.token});
  return o;
}

admin::AdminOptions AdminOptionsFor(const config::Config& c) {
  admin::AdminOptions o;
  o.listen = c.listen.metrics;
  return o;
}

}  // namespace shardcache::daemon
