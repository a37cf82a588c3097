// Defaults of the local service and its loaders that config/ exposes as keys: each written once,
// here. LocalServiceOptions and LoaderPipelineOptions start from them, and so does
// config::Config, which cannot include those headers (they pull in the whole serving path).
#pragma once

#include <cstdint>

namespace shardcache::serve {

// listen.socket. The client's public header restates it as shardcache::kDefaultSocketPath
// (it cannot include daemon headers); serve_local_test checks the two are equal.
inline constexpr char kDefaultSocketPath[] = "/run/shardcache/shardcached.sock";

inline constexpr uint64_t kDefaultArenaBytes = 512ull << 20;      // local.arena_size
inline constexpr uint32_t kDefaultSlots = 16;                     // local.slots
inline constexpr uint32_t kDefaultMaxConnections = 256;           // local.max_connections
inline constexpr uint64_t kDefaultLookaheadBytes = 256ull << 20;  // fetch.prefetch

}  // namespace shardcache::serve
