// Config: the daemon's TOML configuration (/etc/shardcache/shardcached.toml) as one typed
// struct, its parser, and the rules for what a SIGHUP may change at run time.
//
// config/ alone reads configuration files. Every key of the operator-facing contract (the
// table in shared/DESIGN.md) maps to one field here. Components own their option types and
// defaults: [cache] is the cache's own CacheOptions, embedded, and the other sections start
// from the constants their components define (fetch.* from grpc_source_options.h, local.*
// from serve_defaults.h, listen.* from the services), so each default is written once. config/shardcached.toml documents every key with its
// default, its meaning and whether SIGHUP reloads it; KnownKeys() is the machine-readable
// list of the same (a test keeps the two in step).
//
// Parsing validates the whole file before returning: every unknown key and every bad value
// is reported at once, each line naming its full key ("cache.size: '12 parsecs' is not a
// size"), so an operator fixes a file in one round.
//
// Thread safety: plain values and pure functions.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "daemon/admin/admin_server.h"
#include "daemon/cache/cache_options.h"
#include "daemon/serve/serve_defaults.h"
#include "daemon/upstream/grpc_source_options.h"
#include "objstore/options.h"

namespace shardcache::config {

// Smallest cache.segment_size: two chunks of the default chunk size (shardctl index
// --chunk-bytes, 4 MiB), so that a segment sealed with a chunk that no longer fits wastes at most
// half of it. A dataset indexed with chunks larger than a segment is served but its chunks are
// not cached (logged once per dataset, counted in shardcache_cache_unstored_chunks_total).
constexpr uint64_t kMinSegmentBytes = 8ull << 20;

// cache.dir unless configured: systemd's CacheDirectory= (the component itself has no default
// directory; tests and tools always name one).
inline constexpr char kDefaultCacheDir[] = "/var/cache/shardcache";

struct Config {
  // Required: "file:///abs/dir", "grpc://host:port", "grpcs://host:port", "s3://bucket/prefix"
  // or "https://host/path" (upstream_uri.h).
  std::string upstream;

  struct Listen {
    std::string origin;                                 // "host:port"; "" = off
    std::string socket = serve::kDefaultSocketPath;       // Unix socket; "" = off
    std::string metrics = admin::kDefaultListen;          // admin HTTP; "" = off
    bool operator==(const Listen&) const = default;
  } listen;

  // [cache]: dir, require_mount, size (size_bytes), memory_size (memory_bytes), min_free,
  // eviction, segment_size (segment_bytes); the options without a key keep their defaults.
  cache::CacheOptions cache = [] {
    cache::CacheOptions o;
    o.dir = kDefaultCacheDir;
    return o;
  }();

  struct Fetch {
    uint64_t bandwidth_bytes_per_s = 0;           // 0 = no cap
    uint32_t connections = upstream::kDefaultConnections;        // initial upstream connections
    uint32_t max_connections = upstream::kDefaultMaxConnections; // ceiling when adapting to the link
    std::chrono::milliseconds timeout = upstream::kDefaultCallTimeout;  // deadline of one call
    // How long reads wait for an upstream that stopped answering before they fail with
    // Unavailable (naming the upstream and its last error).
    std::chrono::milliseconds outage_timeout = upstream::kDefaultOutageTimeout;
    uint32_t retries = upstream::kDefaultRetries;  // attempts after the first, jittered backoff
    uint64_t max_in_flight_bytes = upstream::kDefaultMaxInFlightBytes;  // fetched, not yet delivered
    uint64_t prefetch_bytes = serve::kDefaultLookaheadBytes;  // per-loader planned prefetch
    bool operator==(const Fetch&) const = default;
  } fetch;

  // [peers]: an upstream set / peer group (daemon/upstream/peer_group.h); empty = none.
  struct Peers {
    std::vector<std::string> members;  // "host:port" of each member's Origin service
    std::string dns;                   // "name:port": a name resolving to every member
    std::string self;                  // how members name this daemon; "" = found by address
    std::chrono::milliseconds refresh{10000};  // DNS re-resolution period
    std::chrono::milliseconds timeout{5000};   // a silent member is skipped after this long
    bool enabled() const { return !members.empty() || !dns.empty(); }
    bool operator==(const Peers&) const = default;
  } peers;

  // [objstore]: how an s3:// or https:// upstream is reached (objstore/options.h, whose
  // defaults these are). Holds a secret (secret_access_key, session_token): never printed.
  objstore::ObjectStoreOptions objstore;

  struct Tls {
    std::string cert;                 // PEM: this daemon's certificate (server; client to grpcs upstream)
    std::string key;                  // PEM private key of `cert`
    std::string ca;                   // PEM bundle that peers' certificates must chain to
    bool require_client_cert = false; // Origin service refuses clients without a cert from `ca`
    bool operator==(const Tls&) const = default;
  } tls;

  struct Auth {
    std::string token;       // bearer token: required from Origin clients, sent upstream
    std::string token_file;  // file holding the token (read at load; `token` then holds it)
    bool operator==(const Auth&) const = default;
  } auth;

  // [checkpoints]: the write path (daemon/checkpoint/). A daemon that receives uploads sets
  // `root` and `writers`; a node daemon stages trainers' checkpoints in `dir` and uploads them.
  struct Checkpoints {
    struct Writer {
      std::string prefix;      // names this token may write: "run7/" (a '/'-ended prefix)
      std::string token_file;  // file holding the writer's bearer token
      std::string token;       // read from token_file at load
      bool operator==(const Writer&) const = default;
    };
    std::string root;              // receiving end: directory objects are committed under; "" = no writes
    std::vector<Writer> writers;   // "PREFIX=TOKEN_FILE" each
    std::string dir;               // node: local staging; "" = <cache.dir>/checkpoints
    uint64_t upload_bandwidth_bytes_per_s = 0;  // node: cap on upload bytes/s; 0 = none
    uint32_t keep_local = 2;       // node: uploaded saves kept locally per run (checkpoint_stage.h)
    bool operator==(const Checkpoints&) const = default;
  } checkpoints;

  struct Log {
    std::string level = "info";  // trace|debug|info|warn|error|critical|off
    bool operator==(const Log&) const = default;
  } log;

  struct Local {
    // Peers allowed on listen.socket (SO_PEERCRED, SO_PEERGROUPS): by uid, or by any of their
    // groups; all empty = only the daemon's own uid and root.
    std::vector<uint32_t> allowed_uids;
    std::vector<std::string> allowed_groups = {"shardcache-users"};  // names, resolved at start
    std::vector<uint32_t> allowed_gids;
    uint64_t arena_size_bytes = serve::kDefaultArenaBytes;  // shared-memory arena per client
    uint32_t slots = serve::kDefaultSlots;                  // batch slots per arena
    uint32_t max_connections = serve::kDefaultMaxConnections;  // trainer connections; more are refused
    bool operator==(const Local&) const = default;
  } local;

  bool operator==(const Config&) const = default;
};

// What parsing may touch besides the text.
enum class ReferencedFiles {
  kRead,  // check that tls.cert/key/ca can be read, read auth.token_file (the daemon)
  kSkip,  // neither: for tools that need only addresses, run by users who may not read secrets
};
// Parses TOML text. `where` names the source in messages (a path, "<string>"). On failure the
// status is InvalidArgument with one line per problem: "where: N problem(s)\n  key: what".
Result<Config> ParseConfig(const std::string& text, const std::string& where = "<config>",
                           ReferencedFiles files = ReferencedFiles::kRead);
// Reads and parses a file; NotFound / PermissionDenied name the path.
Result<Config> LoadConfig(const std::string& path, ReferencedFiles files = ReferencedFiles::kRead);

// Every key the parser accepts, with whether SIGHUP applies it to the running daemon.
struct KeyInfo {
  std::string name;  // full dotted name, e.g. "cache.size"
  bool reloadable;
};
const std::vector<KeyInfo>& KnownKeys();

// Which keys differ between the running and the newly read config, split into those a
// SIGHUP applies (cache.size, fetch.bandwidth, fetch.prefetch, log.level) and those that need
// a restart.
struct ConfigDiff {
  std::vector<std::string> reloadable;
  std::vector<std::string> not_reloadable;
  bool empty() const { return reloadable.empty() && not_reloadable.empty(); }
};
ConfigDiff ReloadableDiff(const Config& running, const Config& loaded);

// The most memory the buffers this config sizes can take: the DRAM tier plus a full arena for
// every allowed trainer connection when listen.socket is on (arena pages count against the
// daemon, which writes them).
// The daemon's working memory (index, threads, fetches in flight) comes on top.
uint64_t BufferMemoryBytes(const Config& c);

// "30s", "500ms", "2m", "1h", or an integer number of seconds.
Result<std::chrono::milliseconds> ParseDuration(const std::string& text);

}  // namespace shardcache::config
