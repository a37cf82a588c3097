// shardctl warm --upstream URI [--cache-dir DIR --cache-size N] [options] DATASET
// Fills a cache with a whole dataset: every chunk of every shard is read once through a
// CachedSource (single-flight, DRAM + NVMe tiers, chunks verified against the manifest) whose
// upstream is URI — grpc://HOST:PORT / grpcs://HOST:PORT (another shardcached, with the
// daemon's own parallel-stream client) or file:///DIR. Without --cache-dir the bytes are only
// fetched and verified (a goodput measurement of the upstream path). A progress bar is drawn
// on a terminal; the last line reports goodput. --json adds one machine-readable line.
//
// shardctl warm --socket PATH [--timeout S] [--json] DATASET
// Asks the running node daemon at PATH (its listen.socket) to fill its own cache with the
// dataset: WarmDataset starts a daemon-side job (local protocol 2, see local.proto), which this
// command polls with WarmStatus for the progress bar and the final goodput line. No Hello is
// sent, so the daemon maps no arena for this connection. Interrupting the command (or
// --timeout) leaves the job running in the daemon; running the command again attaches to it.
// Exit 0 once the job has read every chunk, 1 when it failed or the daemon cannot be reached.
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/log.h"
#include "common/mutex.h"
#include "common/units.h"
#include "daemon/cache/cached_source.h"
#include "daemon/upstream/file_source.h"
#include "daemon/upstream/grpc_source.h"
#include "daemon/upstream/object_source.h"
#include "daemon/upstream/upstream_uri.h"
#include "shardcache/local.pb.h"
#include "shardcache/local_wire.h"
#include "tools/shardctl/command.h"
#include "tools/shardctl/local_control.h"
#include "tools/shardctl/objstore_flags.h"
#include "tools/shardctl/progress.h"

namespace shardcache::shardctl {
namespace {

struct WarmArgs {
  std::string upstream, socket, token, token_file, ca, cert, key, bandwidth = "0";
  // Empty: the cache's own default (CacheOptions), shown in --help.
  std::string cache_dir, cache_size = "0", memory_size = "0", segment_size, eviction, min_free;
  int connections = upstream::kDefaultConnections, max_connections = upstream::kDefaultMaxConnections;
  int parallel = 4;
  int timeout_s = 3600;
  uint32_t range_chunks = 64;
  bool json = false;
  std::string dataset;
  ObjectStoreFlags store;  // s3:// and https:// upstreams
};

Result<std::unique_ptr<ChunkSource>> MakeUpstream(const WarmArgs& a, upstream::GrpcSource** grpc) {
  *grpc = nullptr;
  SC_ASSIGN_OR_RETURN(upstream::UpstreamUri uri, upstream::ParseUpstreamUri(a.upstream));
  if (uri.scheme == upstream::UpstreamUri::Scheme::kFile) {
    SC_ASSIGN_OR_RETURN(auto f, upstream::FileSource::Open(uri.path));
    return std::unique_ptr<ChunkSource>(std::move(f));
  }
  if (uri.scheme == upstream::UpstreamUri::Scheme::kObject) {
    // Endpoint, region and credentials from the flags, else the environment (objstore_flags.h).
    SC_ASSIGN_OR_RETURN(objstore::ObjectStoreOptions options, a.store.Options());
    SC_ASSIGN_OR_RETURN(auto o, upstream::ObjectSource::Open(uri.object, options));
    return std::unique_ptr<ChunkSource>(std::move(o));
  }
  upstream::GrpcSourceOptions o;
  o.target = uri.target;
  o.tls = uri.tls();
  o.ca = a.ca;
  o.cert = a.cert;
  o.key = a.key;
  o.token = a.token;
  if (!a.token_file.empty()) {
    SC_ASSIGN_OR_RETURN(o.token, ReadFileToString(a.token_file));
    while (!o.token.empty() && (o.token.back() == '\n' || o.token.back() == '\r')) o.token.pop_back();
  }
  o.connections = a.connections;
  o.max_connections = a.max_connections;
  SC_ASSIGN_OR_RETURN(o.bandwidth_bytes_per_s, ParseRate(a.bandwidth));
  SC_ASSIGN_OR_RETURN(auto g, upstream::GrpcSource::Create(o));
  *grpc = g.get();
  return std::unique_ptr<ChunkSource>(std::move(g));
}

Result<cache::CacheOptions> MakeCacheOptions(const WarmArgs& a) {
  cache::CacheOptions o;
  o.dir = a.cache_dir;
  if (!a.cache_dir.empty()) {
    SC_ASSIGN_OR_RETURN(o.size_bytes, ParseBytes(a.cache_size));
    if (o.size_bytes == 0) return InvalidArgument("--cache-dir needs --cache-size > 0");
  }
  SC_ASSIGN_OR_RETURN(o.memory_bytes, ParseBytes(a.memory_size));
  if (!a.segment_size.empty()) {
    SC_ASSIGN_OR_RETURN(o.segment_bytes, ParseBytes(a.segment_size));
  }
  if (!a.eviction.empty()) {
    SC_ASSIGN_OR_RETURN(o.eviction, cache::ParseEvictionPolicy(a.eviction));
  }
  if (!a.min_free.empty()) {
    auto min_free = cache::ParseMinFree(a.min_free);
    if (!min_free.ok()) return min_free.status().WithContext("--min-free");
    o.min_free = *min_free;
  }
  o.max_fetch_run_chunks = a.range_chunks;
  SC_RETURN_IF_ERROR(o.Validate());
  return o;
}

int RunWarmSocket(const WarmArgs& a) {
  auto fail = [&](const Status& s) {
    std::fprintf(stderr, "shardctl warm: %s\n", s.ToString().c_str());
    return 1;
  };
  auto conn = LocalControl::Connect(a.socket);
  if (!conn.ok()) return fail(conn.status().WithContext("warming '" + a.dataset + "'"));
  v1::LocalRequest req;
  v1::LocalResponse resp;
  req.mutable_warm_dataset()->set_dataset(a.dataset);
  if (Status s = conn->Call(req, &resp, "WarmDataset"); !s.ok()) return fail(s);
  const v1::WarmDatasetResponse started = resp.warm_dataset();
  const uint64_t id = started.warm_id();
  if (started.already_running()) {
    std::fprintf(stderr, "shardctl warm: '%s' is already being warmed (warm %llu); following it\n",
                 a.dataset.c_str(), static_cast<unsigned long long>(id));
  }
  const auto start = std::chrono::steady_clock::now();
  ProgressBar bar("warm");
  v1::WarmStatusResponse st;
  req.Clear();
  req.mutable_warm_status()->set_warm_id(id);
  for (;;) {
    resp.Clear();
    if (Status s = conn->Call(req, &resp, "WarmStatus"); !s.ok()) {
      bar.Finish();
      return fail(s.WithContext("following warm " + std::to_string(id) + " of '" + a.dataset + "'"));
    }
    st = resp.warm_status();
    bar.Update(st.done_bytes(), st.total_bytes());
    if (st.finished()) break;
    if (std::chrono::steady_clock::now() - start > std::chrono::seconds(a.timeout_s)) {
      bar.Finish();
      std::fprintf(stderr,
                   "shardctl warm: gave up waiting after %d s with %s of %s warmed; warm %llu of '%s' "
                   "keeps running in the daemon (run the same command again to follow it)\n",
                   a.timeout_s, FormatBytes(st.done_bytes()).c_str(), FormatBytes(st.total_bytes()).c_str(),
                   static_cast<unsigned long long>(id), a.dataset.c_str());
      return 1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  bar.Finish();
  if (st.error_code() != 0) {
    std::fprintf(stderr, "shardctl warm: %s (after %s of %s)\n",
                 Status(static_cast<StatusCode>(st.error_code()), st.error()).ToString().c_str(),
                 FormatBytes(st.done_bytes()).c_str(), FormatBytes(st.total_bytes()).c_str());
    return 1;
  }
  if (st.done_bytes() != st.total_bytes()) {
    std::fprintf(stderr, "shardctl warm: the daemon ended warm %llu of '%s' after %s of %s without an error\n",
                 static_cast<unsigned long long>(id), a.dataset.c_str(), FormatBytes(st.done_bytes()).c_str(),
                 FormatBytes(st.total_bytes()).c_str());
    return 1;
  }
  const double secs = std::max(1e-6, static_cast<double>(st.elapsed_us()) / 1e6);
  const uint64_t bytes = st.done_bytes();
  const double mbit = static_cast<double>(bytes) * 8 / secs / 1e6;
  std::printf("warmed '%s' (version %s) in the daemon at %s: %s in %.3f s = %.1f MB/s (%.0f Mbit/s); "
              "from upstream %s, already cached %s; %llu chunks\n",
              st.dataset().c_str(), st.version().c_str(), a.socket.c_str(), FormatBytes(bytes).c_str(), secs,
              static_cast<double>(bytes) / secs / 1e6, mbit, FormatBytes(st.fetched_bytes()).c_str(),
              FormatBytes(st.cached_bytes()).c_str(), static_cast<unsigned long long>(st.done_chunks()));
  if (a.json) {
    nlohmann::json j;
    j["dataset"] = st.dataset();
    j["version"] = st.version();
    j["warm_id"] = id;
    j["bytes"] = bytes;
    j["chunks"] = st.done_chunks();
    j["seconds"] = secs;
    j["mbit"] = mbit;
    j["upstream_bytes"] = st.fetched_bytes();
    j["cached_bytes"] = st.cached_bytes();
    j["already_running"] = started.already_running();
    std::printf("%s\n", j.dump().c_str());
  }
  return 0;
}

int RunWarm(const WarmArgs& a) {
  if (!a.socket.empty()) {
    if (!a.upstream.empty() || !a.cache_dir.empty()) {
      std::fprintf(stderr, "shardctl warm: --socket asks a running daemon to warm its own cache; "
                           "it does not combine with --upstream or --cache-dir\n");
      return 2;
    }
    return RunWarmSocket(a);
  }
  if (a.upstream.empty()) {
    std::fprintf(stderr, "shardctl warm: --upstream URI or --socket PATH is required\n");
    return 2;
  }
  if (a.parallel < 1) {
    std::fprintf(stderr, "shardctl warm: --parallel must be at least 1\n");
    return 2;
  }
  spdlog::set_level(spdlog::level::warn);
  auto copts = MakeCacheOptions(a);
  if (!copts.ok()) {
    std::fprintf(stderr, "shardctl warm: %s\n", copts.status().ToString().c_str());
    return 2;
  }
  upstream::GrpcSource* grpc = nullptr;
  auto up = MakeUpstream(a, &grpc);
  if (!up.ok()) {
    std::fprintf(stderr, "shardctl warm: upstream '%s': %s\n", a.upstream.c_str(), up.status().ToString().c_str());
    return 2;
  }
  const auto start = std::chrono::steady_clock::now();
  auto cache = cache::CachedSource::Open(*copts, std::move(*up));
  if (!cache.ok()) {
    std::fprintf(stderr, "shardctl warm: opening the cache: %s\n", cache.status().ToString().c_str());
    return 1;
  }
  auto& src = **cache;
  auto d = src.OpenDataset(a.dataset);
  if (!d.ok()) {
    std::fprintf(stderr, "shardctl warm: %s\n", d.status().ToString().c_str());
    return 1;
  }
  const auto& m = (*d)->manifest;
  // Work items: ranges of up to range_chunks chunks, shard by shard.
  struct Item {
    uint32_t shard;
    uint64_t first, count;
  };
  std::vector<Item> items;
  for (uint32_t s = 0; s < static_cast<uint32_t>(m.shards_size()); ++s) {
    const uint64_t n = dataset::ChunkCount(m, s);
    for (uint64_t c = 0; c < n; c += a.range_chunks) items.push_back({s, c, std::min<uint64_t>(a.range_chunks, n - c)});
  }
  const uint64_t total = m.total_bytes();
  std::atomic<size_t> next{0};
  std::atomic<uint64_t> done{0};
  Mutex err_mu;
  Status first_error;
  ReadOptions ro;
  ro.deadline = start + std::chrono::seconds(a.timeout_s);
  std::vector<std::thread> workers;
  for (int w = 0; w < a.parallel; ++w) {
    workers.emplace_back([&] {
      while (true) {
        const size_t i = next.fetch_add(1);
        if (i >= items.size()) return;
        Status s = src.ReadChunks(*d, items[i].shard, items[i].first, items[i].count, ro,
                                  [&](uint64_t, const ChunkPtr& c) {
                                    done.fetch_add(c->bytes.size());
                                    return Status::Ok();
                                  });
        if (!s.ok()) {
          MutexLock lock(&err_mu);
          if (first_error.ok()) {
            first_error = s.WithContext("shard " + std::to_string(items[i].shard) + " ('" +
                                        m.shards(static_cast<int>(items[i].shard)).path() + "') chunks " +
                                        std::to_string(items[i].first) + ".." +
                                        std::to_string(items[i].first + items[i].count));
          }
          next.store(items.size());  // stop handing out work
          return;
        }
      }
    });
  }
  ProgressBar bar("warm");
  while (true) {
    bar.Update(done.load(), total);
    if (next.load() >= items.size()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  for (auto& t : workers) t.join();
  bar.Update(done.load(), total);
  const double fetch_secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  src.Flush();  // durable before we say "warm"
  bar.Finish();
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (!first_error.ok()) {
    std::fprintf(stderr, "shardctl warm: %s\n", first_error.ToString().c_str());
    return 1;
  }
  const auto st = src.Stats();
  const uint64_t bytes = done.load();
  const double mbit = static_cast<double>(bytes) * 8 / secs / 1e6;
  uint64_t wire = st.served_upstream_bytes;
  if (grpc != nullptr) wire = grpc->stats().wire_bytes;
  std::printf("warmed '%s' (version %s): %s in %.3f s (fetch %.3f s) = %.1f MB/s (%.0f Mbit/s); "
              "from upstream %s (wire %s), already cached %s; cache: %llu chunks, %s of %s used\n",
              a.dataset.c_str(), (*d)->version.c_str(), FormatBytes(bytes).c_str(), secs, fetch_secs,
              static_cast<double>(bytes) / secs / 1e6, mbit, FormatBytes(st.served_upstream_bytes).c_str(),
              FormatBytes(wire).c_str(), FormatBytes(st.served_dram_bytes + st.served_nvme_bytes).c_str(),
              static_cast<unsigned long long>(st.nvme.entries),
              FormatBytes(st.nvme.segment_allocated_bytes + st.nvme.index_bytes).c_str(),
              FormatBytes(st.nvme.size_bytes).c_str());
  if (a.json) {
    std::printf("{\"bytes\": %llu, \"seconds\": %.6f, \"fetch_seconds\": %.6f, \"mbit\": %.1f, "
                "\"upstream_bytes\": %llu, \"wire_bytes\": %llu, \"cached_entries\": %llu, "
                "\"cache\": %s}\n",
                static_cast<unsigned long long>(bytes), secs, fetch_secs, mbit,
                static_cast<unsigned long long>(st.served_upstream_bytes), static_cast<unsigned long long>(wire),
                static_cast<unsigned long long>(st.nvme.entries), st.ToJson().c_str());
  }
  return 0;
}

const CommandRegistration kWarm(
    "warm", "Fill a cache with a whole dataset from an upstream, or ask a running daemon to (--socket)",
    [](CLI::App* sub) -> std::function<int()> {
      auto a = std::make_shared<WarmArgs>();
      sub->add_option("--upstream", a->upstream,
                      "grpc://HOST:PORT, grpcs://HOST:PORT, file:///DIR, s3://BUCKET/PREFIX or https://HOST/PATH");
      sub->add_option("--socket", a->socket, "Ask the running daemon at this Unix socket to warm its own cache");
      sub->add_option("--cache-dir", a->cache_dir, "Cache directory to fill (omit: fetch and verify only)");
      sub->add_option("--cache-size", a->cache_size, "Cache budget, e.g. 800GiB")->capture_default_str();
      sub->add_option("--memory-size", a->memory_size, "DRAM tier budget")->capture_default_str();
      const cache::CacheOptions defaults;
      sub->add_option("--segment-size", a->segment_size, "NVMe segment size")
          ->default_str(FormatBytes(defaults.segment_bytes));
      sub->add_option("--eviction", a->eviction, "lru | static | clairvoyant")
          ->default_str(cache::EvictionPolicyName(defaults.eviction));
      sub->add_option("--min-free", a->min_free, "Free-space floor, e.g. 5% or 10GiB")
          ->default_str(std::to_string(static_cast<int>(defaults.min_free.fraction * 100)) + "%");
      sub->add_option("--token", a->token, "Bearer token");
      sub->add_option("--token-file", a->token_file, "File holding the bearer token");
      sub->add_option("--ca", a->ca, "PEM CA bundle for grpcs://");
      sub->add_option("--cert", a->cert, "PEM client certificate");
      sub->add_option("--key", a->key, "PEM private key of --cert");
      sub->add_option("--connections", a->connections, "Initial parallel streams")->capture_default_str();
      sub->add_option("--max-connections", a->max_connections, "Ceiling for adaptive streams")->capture_default_str();
      sub->add_option("--bandwidth", a->bandwidth, "Cap, e.g. 500Mbit; 0 = none")->capture_default_str();
      sub->add_option("--parallel", a->parallel, "Concurrent range reads")->capture_default_str();
      sub->add_option("--range-chunks", a->range_chunks, "Chunks per range read")->capture_default_str();
      sub->add_option("--timeout", a->timeout_s,
                      "Seconds for the whole warm (--socket: to wait; the daemon's job goes on)")
          ->capture_default_str();
      sub->add_flag("--json", a->json, "Also print one JSON line with the figures");
      a->store.AddTo(sub);
      sub->add_option("DATASET", a->dataset, "Dataset name")->required();
      return [a] { return RunWarm(*a); };
    });

}  // namespace
}  // namespace shardcache::shardctl
