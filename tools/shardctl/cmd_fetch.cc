// shardctl fetch --upstream grpc://HOST:PORT [--token T] [--ca F] DATASET SHARD OUT
// Fetches one whole shard (or, with SHARD = "all", every shard into directory OUT) through the
// Origin service with the daemon's own upstream client (GrpcSource): parallel streams, every
// chunk verified against the manifest hash before it is written. Prints size, time, rate and
// wire bytes; --json adds one machine-readable line for scripts and benchmarks.
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>

#include "common/fs.h"
#include "common/units.h"
#include "daemon/upstream/grpc_source.h"
#include "tools/shardctl/command.h"
#include "tools/shardctl/progress.h"

namespace shardcache::shardctl {
namespace {

struct FetchArgs {
  std::string upstream, token, token_file, ca, cert, key, bandwidth = "0";
  int connections = 4, max_connections = upstream::kDefaultMaxConnections;
  int timeout_s = 600;
  bool json = false;
  std::string dataset, shard, out;
};

// Writes shard `shard` to `path` (via path.part, renamed when complete and verified).
Status FetchShard(upstream::GrpcSource& src, const DatasetPtr& d, uint32_t shard,
                  const std::string& path, std::chrono::steady_clock::time_point deadline,
                  ProgressBar& bar, uint64_t* done_bytes, uint64_t total_bytes) {
  const std::string part = path + ".part";
  const auto parent = std::filesystem::path(path).parent_path();
  if (!parent.empty()) SC_RETURN_IF_ERROR(MakeDirs(parent.string()));
  SC_ASSIGN_OR_RETURN(UniqueFd fd, OpenFile(part, O_WRONLY | O_CREAT | O_TRUNC, 0644));
  const auto& m = d->manifest;
  ReadOptions ro;
  ro.deadline = deadline;
  Status s = src.ReadChunks(d, shard, 0, dataset::ChunkCount(m, shard), ro,
                            [&](uint64_t c, const ChunkPtr& chunk) -> Status {
                              SC_RETURN_IF_ERROR(PwriteFull(fd.get(), chunk->bytes.data(),
                                                            chunk->bytes.size(),
                                                            c * m.chunk_bytes(), part));
                              *done_bytes += chunk->bytes.size();
                              bar.Update(*done_bytes, total_bytes);
                              return Status::Ok();
                            });
  if (!s.ok()) {
    ::unlink(part.c_str());
    return s;
  }
  if (::rename(part.c_str(), path.c_str()) != 0) return ErrnoStatus(errno, "rename " + part);
  return Status::Ok();
}

int RunFetch(const FetchArgs& a) {
  upstream::GrpcSourceOptions o;
  o.target = a.upstream;
  o.ca = a.ca;
  o.cert = a.cert;
  o.key = a.key;
  o.token = a.token;
  if (!a.token_file.empty()) {
    auto t = ReadFileToString(a.token_file);
    if (!t.ok()) {
      std::fprintf(stderr, "shardctl fetch: --token-file: %s\n", t.status().ToString().c_str());
      return 2;
    }
    o.token = *t;
    while (!o.token.empty() && (o.token.back() == '\n' || o.token.back() == '\r')) o.token.pop_back();
  }
  o.connections = a.connections;
  o.max_connections = a.max_connections;
  auto rate = ParseRate(a.bandwidth);
  if (!rate.ok()) {
    std::fprintf(stderr, "shardctl fetch: --bandwidth: %s\n", rate.status().ToString().c_str());
    return 2;
  }
  o.bandwidth_bytes_per_s = *rate;
  auto src = upstream::GrpcSource::Create(o);
  if (!src.ok()) {
    std::fprintf(stderr, "shardctl fetch: %s\n", src.status().ToString().c_str());
    return 2;
  }
  const auto start = std::chrono::steady_clock::now();
  const auto deadline = start + std::chrono::seconds(a.timeout_s);
  auto d = (*src)->OpenDataset(a.dataset);
  if (!d.ok()) {
    std::fprintf(stderr, "shardctl fetch: %s\n", d.status().ToString().c_str());
    return 1;
  }
  const auto& m = (*d)->manifest;
  std::vector<uint32_t> shards;
  if (a.shard == "all") {
    for (int i = 0; i < m.shards_size(); ++i) shards.push_back(static_cast<uint32_t>(i));
  } else {
    bool found = false;
    for (int i = 0; i < m.shards_size() && !found; ++i) {
      if (m.shards(i).path() == a.shard) {
        shards.push_back(static_cast<uint32_t>(i));
        found = true;
      }
    }
    if (!found) {
      char* end = nullptr;
      const unsigned long v = std::strtoul(a.shard.c_str(), &end, 10);
      if (a.shard.empty() || *end != '\0' || v >= static_cast<unsigned long>(m.shards_size())) {
        std::fprintf(stderr,
                     "shardctl fetch: dataset '%s' has %d shards; '%s' is neither a shard index "
                     "nor a shard path (or 'all')\n",
                     a.dataset.c_str(), m.shards_size(), a.shard.c_str());
        return 2;
      }
      shards.push_back(static_cast<uint32_t>(v));
    }
  }
  uint64_t total = 0, done = 0;
  for (uint32_t s : shards) total += m.shards(static_cast<int>(s)).size_bytes();
  ProgressBar bar("fetch");
  for (uint32_t s : shards) {
    const std::string path = a.shard == "all" ? a.out + "/" + m.shards(static_cast<int>(s)).path() : a.out;
    Status st = FetchShard(**src, *d, s, path, deadline, bar, &done, total);
    if (!st.ok()) {
      bar.Finish();
      std::fprintf(stderr, "shardctl fetch: shard %u ('%s'): %s\n", s,
                   m.shards(static_cast<int>(s)).path().c_str(), st.ToString().c_str());
      return 1;
    }
  }
  bar.Finish();
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const auto st = (*src)->stats();
  const double mbit = static_cast<double>(done) * 8 / secs / 1e6;
  std::printf("fetched %zu shard(s) of '%s' (version %s): %s in %.3f s = %.1f MB/s (%.0f Mbit/s)\n",
              shards.size(), a.dataset.c_str(), (*d)->version.c_str(), FormatBytes(done).c_str(), secs,
              static_cast<double>(done) / secs / 1e6, mbit);
  std::printf("wire %s (%llu bytes, compression %.2fx), %llu chunks verified, %llu streams, "
              "%llu retries, %llu checksum failures, stream limit %d\n",
              FormatBytes(st.wire_bytes).c_str(), static_cast<unsigned long long>(st.wire_bytes),
              st.wire_bytes ? static_cast<double>(st.payload_bytes) / static_cast<double>(st.wire_bytes) : 1.0,
              static_cast<unsigned long long>(st.chunks), static_cast<unsigned long long>(st.streams),
              static_cast<unsigned long long>(st.retries),
              static_cast<unsigned long long>(st.checksum_failures), st.stream_limit);
  if (a.json) {
    std::printf("{\"bytes\": %llu, \"seconds\": %.6f, \"mbit\": %.1f, \"wire_bytes\": %llu, "
                "\"chunks\": %llu, \"retries\": %llu, \"checksum_failures\": %llu, "
                "\"stream_limit\": %d}\n",
                static_cast<unsigned long long>(done), secs, mbit,
                static_cast<unsigned long long>(st.wire_bytes), static_cast<unsigned long long>(st.chunks),
                static_cast<unsigned long long>(st.retries),
                static_cast<unsigned long long>(st.checksum_failures), st.stream_limit);
  }
  return 0;
}

const CommandRegistration kFetch(
    "fetch", "Fetch a shard from an Origin service (grpc:// or grpcs://), verifying every chunk",
    [](CLI::App* sub) -> std::function<int()> {
      auto a = std::make_shared<FetchArgs>();
      sub->add_option("--upstream", a->upstream, "grpc://HOST:PORT or grpcs://HOST:PORT")->required();
      sub->add_option("--token", a->token, "Bearer token");
      sub->add_option("--token-file", a->token_file, "File holding the bearer token");
      sub->add_option("--ca", a->ca, "PEM CA bundle for grpcs:// (default: system roots)");
      sub->add_option("--cert", a->cert, "PEM client certificate (servers that require one)");
      sub->add_option("--key", a->key, "PEM private key of --cert");
      sub->add_option("--connections", a->connections, "Initial parallel streams")->capture_default_str();
      sub->add_option("--max-connections", a->max_connections, "Ceiling for adaptive streams")
          ->capture_default_str();
      sub->add_option("--bandwidth", a->bandwidth, "Cap, e.g. 500Mbit; 0 = none")->capture_default_str();
      sub->add_option("--timeout", a->timeout_s, "Seconds for the whole fetch")->capture_default_str();
      sub->add_flag("--json", a->json, "Also print one JSON line with the figures");
      sub->add_option("DATASET", a->dataset, "Dataset name")->required();
      sub->add_option("SHARD", a->shard, "Shard index, shard path, or 'all'")->required();
      sub->add_option("OUT", a->out, "Output file (a directory with 'all')")->required();
      return [a] { return RunFetch(*a); };
    });

}  // namespace
}  // namespace shardcache::shardctl
