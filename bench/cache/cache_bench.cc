// cache_bench — figures of the cache tiers measured through their C++ API.
//
//   cache_bench epochs --dir D [--dataset-mib N --cache-mib N --chunk-kib N --segment-kib N]
//       A dataset twice the cache, read for 3 epochs, each a fresh global shuffle of all chunks,
//       through a CachedSource over an in-process upstream, once per eviction policy (lru, static,
//       clairvoyant; the clairvoyant run is given the whole future order as the epoch planner
//       would). Prints per-policy lines and a JSON line: hit_ratio_<policy> (epochs 2-3),
//       upstream_bytes_<policy>.
//
//   cache_bench restart-fill --dir D --entries N [--chunk-bytes B]
//       Fills an NVMe tier with N chunk entries (real writes through NvmeStore, group commits).
//   cache_bench restart-open --dir D
//       Opens (recovers) that tier and prints one JSON line: restart_ready_s (open to ready),
//       entries, rss_mib (VmRSS after ready), rss_hwm_mib.
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <cstdio>
#include <fstream>
#include <string>

#include <CLI/CLI.hpp>
#include <spdlog/spdlog.h>

#include "daemon/cache/nvme_store.h"
#include "tests/cache/epoch_trace.h"

using namespace shardcache;
using namespace shardcache::cache;
using namespace shardcache::testing;

namespace {

double ProcStatusMib(const char* field) {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind(field, 0) == 0) return std::stod(line.substr(std::strlen(field) + 1)) / 1024.0;
  }
  return -1;
}

int Epochs(const std::string& dir, uint64_t dataset_mib, uint64_t cache_mib, uint64_t chunk_kib,
           uint64_t segment_kib, uint32_t epochs) {
  std::string json = "{";
  const EvictionPolicyKind kinds[] = {EvictionPolicyKind::kLru, EvictionPolicyKind::kStatic,
                                      EvictionPolicyKind::kClairvoyant};
  for (auto kind : kinds) {
    EpochTraceOptions o;
    o.epochs = epochs;
    o.dataset.name = "epochs";
    o.dataset.chunk_bytes = chunk_kib << 10;
    o.dataset.shards = 4;
    o.dataset.shard_bytes = (dataset_mib << 20) / 4;
    o.cache.dir = dir + "/" + EvictionPolicyName(kind);
    o.cache.memory_bytes = 0;  // NVMe tier only: hit ratios of the policy under test
    o.cache.segment_bytes = segment_kib << 10;
    o.cache.index_reserve_bytes = 2ull << 20;
    o.cache.size_bytes = (cache_mib << 20) + o.cache.index_reserve_bytes + 8192;
    o.cache.min_free = {0, 0};
    o.cache.eviction = kind;
    auto r = RunEpochTrace(o);
    if (!r.ok()) {
      std::fprintf(stderr, "cache_bench epochs: %s\n", r.status().ToString().c_str());
      return 1;
    }
    if (r->errors != 0) {
      std::fprintf(stderr, "cache_bench epochs: %llu reads failed or returned wrong bytes\n",
                   static_cast<unsigned long long>(r->errors));
      return 1;
    }
    std::printf("%-12s hit ratio epochs 2-%u: %.3f   upstream %llu MiB (per epoch:", EvictionPolicyName(kind),
                epochs, r->HitRatioAfterFirst(), static_cast<unsigned long long>(r->UpstreamBytes() >> 20));
    for (auto b : r->upstream_bytes_per_epoch) std::printf(" %llu", static_cast<unsigned long long>(b >> 20));
    std::printf(")   %.1f s\n", r->seconds);
    if (std::getenv("CACHE_BENCH_VERBOSE")) std::printf("  cache stats: %s\n", r->cache_stats_json.c_str());
    std::fflush(stdout);
    const std::string name = EvictionPolicyName(kind);
    json += "\"hit_ratio_" + name + "\": " + std::to_string(r->HitRatioAfterFirst()) + ", ";
    json += "\"upstream_bytes_" + name + "\": " + std::to_string(r->UpstreamBytes()) + ", ";
  }
  json += "\"dataset_bytes\": " + std::to_string(dataset_mib << 20) + ", \"cache_bytes\": " +
          std::to_string(cache_mib << 20) + ", \"chunk_bytes\": " + std::to_string(chunk_kib << 10) +
          ", \"segment_bytes\": " + std::to_string(segment_kib << 10) + ", \"epochs\": " + std::to_string(epochs) + "}";
  std::printf("%s\n", json.c_str());
  return 0;
}

CacheOptions RestartOptions(const std::string& dir, uint64_t entries, uint64_t chunk_bytes) {
  CacheOptions o;
  o.dir = dir;
  o.memory_bytes = 0;
  o.min_free = {0, 0};
  o.segment_bytes = 256ull << 20;
  // Room for every entry plus the index.
  o.size_bytes = entries * ExtentBytes(chunk_bytes) + 4 * o.segment_bytes + (512ull << 20);
  return o;
}

int RestartFill(const std::string& dir, uint64_t entries, uint64_t chunk_bytes) {
  auto store = NvmeStore::Open(RestartOptions(dir, entries, chunk_bytes), nullptr);
  if (!store.ok()) {
    std::fprintf(stderr, "cache_bench restart-fill: %s\n", store.status().ToString().c_str());
    return 1;
  }
  auto chunk = std::make_shared<Chunk>();
  chunk->bytes = AlignedBuffer(chunk_bytes);
  for (uint64_t i = 0; i < chunk_bytes; ++i) chunk->bytes.data()[i] = static_cast<uint8_t>(i * 7);
  chunk->hash = ChunkDigest(chunk->bytes.data(), chunk_bytes);
  const auto t0 = std::chrono::steady_clock::now();
  const Hash128 version = VersionId("restart-bench");
  const auto forever = std::chrono::steady_clock::now() + std::chrono::hours(1);
  for (uint64_t i = 0; i < entries; ++i) {
    (*store)->Insert(ChunkKey{version, static_cast<uint32_t>(i >> 16), i & 0xffff}, chunk, forever);
  }
  (*store)->Flush();
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const auto st = (*store)->Stats();
  std::printf("filled %llu entries (%llu segments, index %llu MiB) in %.1f s\n",
              static_cast<unsigned long long>(st.entries), static_cast<unsigned long long>(st.segments),
              static_cast<unsigned long long>(st.index_bytes >> 20), secs);
  return st.entries == entries ? 0 : 1;
}

int RestartOpen(const std::string& dir) {
  CacheOptions o = RestartOptions(dir, 0, 4096);
  o.size_bytes = 1ull << 50;  // whatever was filled; the budget is not under test here
  const auto t0 = std::chrono::steady_clock::now();
  auto store = NvmeStore::Open(o, nullptr);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!store.ok()) {
    std::fprintf(stderr, "cache_bench restart-open: %s\n", store.status().ToString().c_str());
    return 1;
  }
  const auto& rec = (*store)->recovery();
  std::printf("{\"restart_ready_s\": %.4f, \"entries\": %llu, \"dropped_entries\": %llu, \"segments\": %llu, "
              "\"rss_mib\": %.1f, \"rss_hwm_mib\": %.1f}\n",
              secs, static_cast<unsigned long long>(rec.entries),
              static_cast<unsigned long long>(rec.dropped_entries), static_cast<unsigned long long>(rec.segments),
              ProcStatusMib("VmRSS:"), ProcStatusMib("VmHWM:"));
  std::fflush(stdout);
  std::_Exit(0);  // the measurement is done; skip an orderly close of the index
}

}  // namespace

int main(int argc, char** argv) {
  spdlog::set_level(std::getenv("CACHE_BENCH_VERBOSE") ? spdlog::level::info : spdlog::level::warn);
  CLI::App app("cache_bench: cache tier figures through the C++ API");
  app.require_subcommand(1);
  std::string dir;
  uint64_t dataset_mib = 512, cache_mib = 256, chunk_kib = 1024, segment_kib = 16384;
  uint32_t epochs = 3;
  uint64_t entries = 1000000, chunk_bytes = 4096;
  auto* ep = app.add_subcommand("epochs", "hit ratios of lru / static / clairvoyant over shuffled epochs");
  ep->add_option("--dir", dir)->required();
  ep->add_option("--dataset-mib", dataset_mib)->capture_default_str();
  ep->add_option("--cache-mib", cache_mib)->capture_default_str();
  ep->add_option("--chunk-kib", chunk_kib)->capture_default_str();
  ep->add_option("--segment-kib", segment_kib)->capture_default_str();
  ep->add_option("--epochs", epochs)->capture_default_str();
  auto* rf = app.add_subcommand("restart-fill", "fill an NVMe tier with N entries");
  rf->add_option("--dir", dir)->required();
  rf->add_option("--entries", entries)->capture_default_str();
  rf->add_option("--chunk-bytes", chunk_bytes)->capture_default_str();
  auto* ro = app.add_subcommand("restart-open", "open (recover) an NVMe tier; JSON line");
  ro->add_option("--dir", dir)->required();
  CLI11_PARSE(app, argc, argv);
  if (ep->parsed()) return Epochs(dir, dataset_mib, cache_mib, chunk_kib, segment_kib, epochs);
  if (rf->parsed()) return RestartFill(dir, entries, chunk_bytes);
  if (ro->parsed()) return RestartOpen(dir);
  return 2;
}
