// TopView: one frame of `shardctl top` — rates computed between two scrapes of a daemon's
// /metrics: hit ratio, bytes served per tier, upstream goodput and compression, trainers'
// throughput and stall (time spent waiting in NextBatch) per loader.
//
// Per-loader rows come from series labelled by loader (name-stable contract with the local
// service):
//   shardcache_loader_bytes_total{loader=...,dataset=...,rank=...}
//   shardcache_loader_batches_total{...}
//   shardcache_loader_stall_microseconds_total{...}
// Without them the frame shows the node-wide trainer figures (shardcache_serve_*).
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
