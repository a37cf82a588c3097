// The options each stage of the daemon gets from its Config: one translation per component.
// The defaults live in the components (config/ starts from the same constants), so a key the
// operator leaves out gives the component its own default; tests/config/defaults_test.cc checks
// that for every translated field.
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>

#include "config/config.h"
#include "daemon/admin/admin_server.h"
#include "daemon/serve/grpc_server.h"
#include "daemon/serve/local_service.h"
#include "daemon/serve/origin_service.h"
#include "daemon/upstream/grpc_source_options.h"
#include "daemon/upstream/peer_group.h"
#include "daemon/upstream/upstream_uri.h"

namespace shardcache::daemon {

// Upstream client for a grpc:// or grpcs:// `uri` (parsed from c.upstream).
upstream::GrpcSourceOptions GrpcSourceOptionsFor(const config::Config& c, const upstream::UpstreamUri& uri);
// [peers]: members, how this daemon finds itself among them (listen.origin's port) and the
// connections to them (TLS when this daemon serves TLS, the token, modest pools).
upstream::PeerGroupOptions PeerGroupOptionsFor(const config::Config& c);

// The local service, without an access-order observer (the daemon adds one for the
// clairvoyant policy once the cache tier exists).
serve::LocalServiceOptions LocalServiceOptionsFor(const config::Config& c);

// The warm-read lookahead each loader gets: fetch.prefetch, but at most an eighth of the cache
// tiers, so that a loader's warm reads do not evict chunks its own next batches still need
// (bench/run amplification, block shuffle, 64 MiB cache: 64 MiB of lookahead fetched 1.69x the
// dataset, 16 MiB 1.09-1.17x, 4 MiB 1.02x). A daemon without a cache keeps the configured value.
uint64_t LoaderLookahead(const config::Config& c);

serve::ServerOptions OriginServerOptionsFor(const config::Config& c);
// The Origin service's own options: [checkpoints] root and writers (the receiving end).
serve::OriginServiceOptions OriginServiceOptionsFor(const config::Config& c);

// Without handlers (the daemon binds them to itself).
admin::AdminOptions AdminOptionsFor(const config::Config& c);

}  // namespace shardcache::daemon
