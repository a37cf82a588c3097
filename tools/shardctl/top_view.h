// TopView: one frame of `shardctl top` — rates computed between two scrapes of a daemon's
// /metrics: hit ratio, bytes served per tier, upstream goodput and compression, trainers'
// throughput and stall (time spent waiting in NextBatch) per dataset and rank.
//
// Those rows come from the series the local service keeps per (dataset, rank) (name-stable
// contract with daemon/serve/serve_metrics.h):
//   shardcache_loader_bytes_total{dataset=...,rank=...}
//   shardcache_loader_batches_total{...}
//   shardcache_loader_stall_seconds_total{...}
//   shardcache_loader_open{...}            loaders of the pair open now
// A pair is shown while it has open loaders or read in the interval; STALL% is per loader.
// Without any, the frame shows the node-wide trainer figures (shardcache_serve_*).
// In a peer group (shardcache_peer_*{member=...}, daemon/upstream/peer_group.h) it also shows
// where the node's bytes came from — local tiers, peers, its own upstream link — and one row
// per member: state, share owned, rate, bytes, chunks and errors.
//
// Thread safety: pure function.
#pragma once

#include <string>

#include "tools/shardctl/admin_client.h"

namespace shardcache::shardctl {

// `prev` and `cur` are scrapes taken `interval_s` seconds apart.
std::string RenderTopFrame(const Samples& prev, const Samples& cur, double interval_s,
                           const std::string& address);

}  // namespace shardcache::shardctl
