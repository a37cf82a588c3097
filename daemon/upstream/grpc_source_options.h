// GrpcSourceOptions: every knob of the gRPC upstream client (grpc_source.h), apart from it so
// that config/ can take the defaults of its fetch.* keys from here without pulling in gRPC.
// Each default is written once, below; config::Config::Fetch starts from the same constants.
//
// Thread safety: a plain value.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include "daemon/upstream/stream_controller.h"

namespace shardcache::upstream {

// Defaults of the options that config/ exposes as fetch.* keys.
inline constexpr int kDefaultConnections = 32;      // fetch.connections
inline constexpr int kDefaultMaxConnections = 256;  // fetch.max_connections
inline constexpr int kMaxMaxConnections = 1024;     // the largest fetch.max_connections accepted
inline constexpr uint64_t kDefaultMaxInFlightBytes = 512ull << 20;  // fetch.max_in_flight
inline constexpr std::chrono::milliseconds kDefaultCallTimeout{60000};    // fetch.timeout
inline constexpr std::chrono::milliseconds kDefaultOutageTimeout{30000};  // fetch.outage_timeout
inline constexpr int kDefaultRetries = 5;           // fetch.retries

struct GrpcSourceOptions {
  // "host:port" (or a full "grpc://host:port" / "grpcs://host:port", which also sets `tls`;
  // see upstream_uri.h).
  std::string target;
  bool tls = false;
  // PEM file paths (or PEM text starting with "-----BEGIN"). `ca` empty with tls: system roots.
  // `cert` + `key`: client certificate for servers that require one.
  std::string ca, cert, key;
  // Sent as "authorization: Bearer <token>" on every call; "" = none.
  std::string token;
  // Concurrent streams at start, and the ceiling the adaptive controller may reach. Each stream
  // slot owns one HTTP/2 connection and one worker thread, both made when the slot is first
  // needed; `max_connections` is a safety cap, not a target (the controller finds the count
  // the link needs).
  int connections = kDefaultConnections;
  int max_connections = kDefaultMaxConnections;
  // A worker thread with nothing to do for this long exits, and connections unused for this
  // long are closed: a pool grown for a cold epoch shrinks back while the cache serves.
  std::chrono::milliseconds idle_release{30000};
  // Chunk bytes requested but not yet handed to their callers, over all ReadChunks calls
  // (what fetched-ahead chunks may hold in memory). A call that has nothing outstanding may
  // always request one sub-range, so a small budget slows fetching but never stops it.
  uint64_t max_in_flight_bytes = kDefaultMaxInFlightBytes;
  // Upstream wire bytes per second over all streams; 0 = no cap.
  uint64_t bandwidth_bytes_per_s = 0;
  // Deadline of one upstream call (a sub-range stream, a manifest fetch).
  std::chrono::milliseconds call_timeout = kDefaultCallTimeout;
  // How long calls keep retrying an upstream that stopped answering (see above).
  std::chrono::milliseconds outage_timeout = kDefaultOutageTimeout;
  // A probe goes out when nothing answered for this long; also its deadline.
  std::chrono::milliseconds probe_interval{5000};
  // Refetches of one chunk that fails verification before DataLoss; also the retry count of
  // unary calls. (Chunk streams retry transport failures until the caller's deadline.)
  int max_retries = kDefaultRetries;
  // Most chunks per upstream stream (short ranges are split finer; see ReadChunks). One: a
  // stream is window-limited (one 4 MiB chunk takes 240 ms at 512 KiB / 30 ms), so longer
  // streams only make the last chunks of a range, and demand reads waiting for a slot, later;
  // the extra request round trip per chunk is hidden by the other streams. Measured on the
  // cold bench: 1 chunk 684-711 Mbit/s, 4 chunks 611-624.
  int chunks_per_stream = 1;
  // Backoff between attempts: initial, doubled per failure, capped; each jittered x[0.5, 1.5).
  std::chrono::milliseconds backoff_initial{50};
  std::chrono::milliseconds backoff_max{2000};
  // How long a fetched manifest is reused before asking the upstream again: a dataset
  // re-indexed at the origin is seen by datasets opened this long after it, at most. Opens
  // after that share one GetManifest per name however many arrive together. While the upstream
  // is unreachable the last known manifest keeps being returned (cached data stays servable).
  std::chrono::milliseconds manifest_ttl{1000};
  // Ask the origin for zstd where it helps.
  bool accept_zstd = true;
  // This source reads from another member of a peer group (ReadChunksRequest.from_peer).
  bool from_peer = false;
  // Blocks (16 KiB) per message of a whole chunk (ReadChunksRequest.part_blocks), so that a
  // stalled stream shows within a part's time, not a whole chunk's, and a hedge of it fetches
  // only the blocks still missing. 0 = one message per chunk. Default: 64 (1 MiB).
  uint32_t part_blocks = 64;
  // Report the shardcache_upstream_* figures (the long link's); a peer group's member
  // connections report their own (peer_group.h) instead.
  bool report_metrics = true;
  // Adaptive stream control; `initial`/`max` are taken from connections/max_connections.
  StreamControllerOptions controller;
};

}  // namespace shardcache::upstream
