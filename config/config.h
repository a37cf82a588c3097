// Config: the daemon's TOML configuration (/etc/shardcache/shardcached.toml) as one typed
// struct, its parser, and the rules for what a SIGHUP may change at run time.
//
// config/ alone reads configuration files. Every key of the operator-facing contract (the
// table in shared/DESIGN.md) maps to one field here; components receive their own `Options`
// built from these fields by the daemon. config/shardcached.toml documents every key with its
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

namespace shardcache::config {

enum class Eviction { kLru, kStatic, kClairvoyant };
const char* EvictionName(Eviction e);

// Where the daemon gets its data from: "file:///abs/dir", "grpc://host:port" or
// "grpcs://host:port" (TLS).
struct Upstream {
  enum class Scheme { kFile, kGrpc, kGrpcs };
  Scheme scheme = Scheme::kFile;
  std::string path;    // kFile: absolute directory, no trailing slash (except "/")
  std::string target;  // kGrpc/kGrpcs: "host:port" as written
};
// Returns InvalidArgument explaining the accepted forms on anything else.
Result<Upstream> ParseUpstream(const std::string& uri);

// Free-space floor on the cache file system: a fraction of its size ("5%") or bytes ("50GiB").
struct MinFree {
  double percent = 5.0;  // used when bytes == 0
  uint64_t bytes = 0;
  // Bytes to keep free on a file system of `fs_bytes`.
  uint64_t BytesFor(uint64_t fs_bytes) const {
    return bytes != 0 ? bytes : static_cast<uint64_t>(static_cast<double>(fs_bytes) * percent / 100.0);
  }
  bool operator==(const MinFree&) const = default;
};

// Smallest cache.segment_size: two chunks of the default chunk size (shardctl index
// --chunk-bytes, 4 MiB), so that a segment sealed with a chunk that no longer fits wastes at most
// half of it. A dataset indexed with chunks larger than a segment is served but its chunks are
// not cached (logged once per dataset, counted in shardcache_cache_unstored_chunks_total).
constexpr uint64_t kMinSegmentBytes = 8ull << 20;

struct Config {
  // Required. See Upstream.
  std::string upstream;

  struct Listen {
    std::string origin;                                 // "host:port"; "" = off
    std::string socket = "/run/shardcache/shardcached.sock";  // Unix socket; "" = off
    std::string metrics = "127.0.0.1:9750";             // admin HTTP; "" = off
    bool operator==(const Listen&) const = default;
  } listen;

  struct Cache {
    std::string dir = "/var/cache/shardcache";
    // Refuse to start unless `dir` is a mount point other than "/" (the cache disk is mounted
    // there), and never create it.
    bool require_mount = false;
    uint64_t size_bytes = 0;                      // NVMe tier budget; 0 = no NVMe tier
    uint64_t memory_size_bytes = 256ull << 20;    // DRAM tier budget; 0 = no DRAM tier
    MinFree min_free;
    Eviction eviction = Eviction::kLru;
    uint64_t segment_size_bytes = 256ull << 20;   // NVMe segment file size
    bool operator==(const Cache&) const = default;
  } cache;

  struct Fetch {
    uint64_t bandwidth_bytes_per_s = 0;           // 0 = no cap
    uint32_t connections = 8;                     // initial upstream HTTP/2 connections
    uint32_t max_connections = 16;                // ceiling when adapting to the link
    std::chrono::milliseconds timeout{60000};     // deadline of one upstream call
    // How long reads wait for an upstream that stopped answering before they fail with
    // Unavailable (naming the upstream and its last error).
    std::chrono::milliseconds outage_timeout{30000};
    uint32_t retries = 5;                         // attempts after the first, jittered backoff
    uint64_t prefetch_bytes = 256ull << 20;       // per-loader lookahead of planned prefetch
    bool operator==(const Fetch&) const = default;
  } fetch;

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
    uint64_t arena_size_bytes = 512ull << 20;  // shared-memory arena per client
    uint32_t slots = 16;                     // batch slots per arena
    uint32_t max_connections = 256;          // trainer connections at once; more are refused
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
