// shardctl warm --upstream URI [--cache-dir DIR --cache-size N] [options] DATASET
// Fills a cache with a whole dataset: every chunk of every shard is read once through a
// CachedSource (single-flight, DRAM + NVMe tiers, chunks verified against the manifest) whose
// upstream is URI — grpc://HOST:PORT / grpcs://HOST:PORT (another shardcached, with the
// daemon's own parallel-stream client) or file:///DIR. Without --cache-dir the bytes are only
// fetched and verified (a goodput measurement of the upstream path). A progress bar is drawn
// on a terminal; the last line reports goodput. --json adds one machine-readable line.
//
// --socket PATH (asking a running daemon to warm itself) needs the daemon's local protocol and
// is not implemented yet; it exits 2 with a message saying so.
#include <atomic>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <thread>
#include <vector>

#include "common/log.h"
#include "common/units.h"
#include "daemon/cache/cached_source.h"
#include "daemon/upstream/file_source.h"
#include "daemon/upstream/grpc_source.h"
#include "tools/shardctl/command.h"
#include "tools/shardctl/progress.h"

namespace shardcache::shardctl {
namespace {

struct WarmArgs {
  std::string upstream, socket, token, token_file, ca, cert, key, bandwidth = "0";
  std::string cache_dir, cache_size = "0", memory_size = "0", segment_size = "256MiB", eviction = "lru";
  std::string min_free = "5%";
  int connections = 4, max_connections = 16, parallel = 4;
  int timeout_s = 3600;
  uint32_t range_chunks = 64;
  bool json = false;
  std::string dataset;
};

Result<std::unique_ptr<ChunkSource>> MakeUpstream(const WarmArgs& a, upstream::GrpcSource** grpc) {
  *grpc = nullptr;
  if (a.upstream.rfind("file://", 0) == 0) {
    SC_ASSIGN_OR_RETURN(auto f, upstream::FileSource::Open(a.upstream.substr(7)));
    return std::unique_ptr<ChunkSource>(std::move(f));
  }
  upstream::GrpcSourceOptions o;
  SC_RETURN_IF_ERROR(upstream::ParseGrpcTarget(a.upstream, &o));
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
  SC_ASSIGN_OR_RETURN(o.segment_bytes, ParseBytes(a.segment_size));
  SC_ASSIGN_OR_RETURN(o.eviction, cache::ParseEvictionPolicy(a.eviction));
  SC_RETURN_IF_ERROR(cache::ParseMinFree(a.min_free, &o));
  o.max_fetch_run_chunks = a.range_chunks;
  SC_RETURN_IF_ERROR(o.Validate());
  return o;
}

int RunWarm(const WarmArgs& a) {
  if (!a.socket.empty()) {
    std::fprintf(stderr,
                 "shardctl warm: --socket (warming a running daemon) is not implemented yet; "
                 "use --upstream URI with --cache-dir/--cache-size\n");
    return 2;
  }
  if (a.upstream.empty()) {
    std::fprintf(stderr, "shardctl warm: --upstream URI is required\n");
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
  std::mutex err_mu;
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
          std::lock_guard<std::mutex> lock(err_mu);
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
    "warm", "Fill a cache with a whole dataset from an upstream (progress bar, goodput line)",
    [](CLI::App* sub) -> std::function<int()> {
      auto a = std::make_shared<WarmArgs>();
      sub->add_option("--upstream", a->upstream, "grpc://HOST:PORT, grpcs://HOST:PORT or file:///DIR");
      sub->add_option("--socket", a->socket, "Ask the daemon at this Unix socket to warm itself (not yet)");
      sub->add_option("--cache-dir", a->cache_dir, "Cache directory to fill (omit: fetch and verify only)");
      sub->add_option("--cache-size", a->cache_size, "Cache budget, e.g. 800GiB")->capture_default_str();
      sub->add_option("--memory-size", a->memory_size, "DRAM tier budget")->capture_default_str();
      sub->add_option("--segment-size", a->segment_size, "NVMe segment size")->capture_default_str();
      sub->add_option("--eviction", a->eviction, "lru | static | clairvoyant")->capture_default_str();
      sub->add_option("--min-free", a->min_free, "Free-space floor, e.g. 5% or 10GiB")->capture_default_str();
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
      sub->add_option("--timeout", a->timeout_s, "Seconds for the whole warm")->capture_default_str();
      sub->add_flag("--json", a->json, "Also print one JSON line with the figures");
      sub->add_option("DATASET", a->dataset, "Dataset name")->required();
      return [a] { return RunWarm(*a); };
    });

}  // namespace
}  // namespace shardcache::shardctl
