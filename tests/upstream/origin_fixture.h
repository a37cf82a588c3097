// Test fixtures for the upstream tests: a FileSource over a temp root, served by a real Origin
// server on loopback, and GrpcSource clients pointed at it; plus ChunkSource wrappers that
// slow down or corrupt what an origin serves (fault injection beneath the wire).
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include <catch2/catch.hpp>

#include "common/fs.h"
#include "daemon/serve/origin_service.h"
#include "daemon/upstream/file_source.h"
#include "daemon/upstream/grpc_source.h"
#include "testing/datasets.h"
#include "testing/temp_dir.h"
#include "testing/forwarding_source.h"

namespace shardcache::testing {

// Bytes [offset, offset + n) of a file.
inline std::string FileBytes(const std::string& path, uint64_t offset, uint64_t n) {
  auto all = ReadFileToString(path);
  REQUIRE(all.ok());
  return all->substr(offset, n);
}

inline std::string ChunkBytes(const ChunkPtr& c) {
  return std::string(reinterpret_cast<const char*>(c->bytes.data()), c->bytes.size());
}

// Wraps a ChunkSource: counts OpenDataset and ReadChunks calls, optionally sleeps in each open,
// before each chunk or once before one read, and
// corrupts the first `corrupt_first` deliveries of chunk `corrupt_chunk` (keeping the manifest
// hash, so only a verifying receiver notices).
class FaultySource final : public testing::ForwardingSource {
 public:
  explicit FaultySource(ChunkSource& inner) : ForwardingSource(inner) {}
  std::atomic<int> open_calls{0};
  std::atomic<int> open_delay_ms{0};
  std::atomic<int> read_calls{0};
  std::atomic<int> delay_ms{0};
  std::atomic<int64_t> corrupt_chunk{-1};
  std::atomic<int> corrupt_first{0};
  std::atomic<int> stall_next_ms{0};  // the next read (only) waits this long first: a stalled stream
  std::atomic<int> stall_reads{1};    // ... or the next stall_reads reads, each
  std::atomic<bool> reset_next{false};  // the read after that (only) fails as a reset stream would

  Result<DatasetPtr> OpenDataset(const std::string& name) override {
    open_calls.fetch_add(1);
    if (int ms = open_delay_ms.load()) std::this_thread::sleep_for(std::chrono::milliseconds(ms));
    return inner_.OpenDataset(name);
  }

  Status ReadChunks(const DatasetPtr& d, uint32_t shard, uint64_t first, uint64_t count,
                    const ReadOptions& o, const ChunkSink& sink) override {
    read_calls.fetch_add(1);
    if (int ms = TakeStall()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(ms));
    } else if (reset_next.exchange(false)) {
      return Unavailable("injected: connection reset by peer");
    }
    return inner_.ReadChunks(d, shard, first, count, o, [&](uint64_t c, const ChunkPtr& chunk) {
      if (int ms = delay_ms.load()) std::this_thread::sleep_for(std::chrono::milliseconds(ms));
      if (static_cast<int64_t>(c) == corrupt_chunk.load() && corrupt_first.load() > 0) {
        corrupt_first.fetch_sub(1);
        auto bad = std::make_shared<Chunk>();
        bad->bytes = AlignedBuffer(chunk->bytes.size());
        std::memcpy(bad->bytes.data(), chunk->bytes.data(), chunk->bytes.size());
        bad->bytes.data()[bad->bytes.size() / 2] ^= 0x5a;
        bad->hash = chunk->hash;
        return sink(c, bad);
      }
      return sink(c, chunk);
    });
  }

 private:
  int TakeStall() {
    std::lock_guard<std::mutex> lock(stall_mu_);
    const int ms = stall_next_ms.load();
    if (ms > 0 && stall_reads.fetch_sub(1) <= 1) {
      stall_next_ms.store(0);
      stall_reads.store(1);
    }
    return ms;
  }
  std::mutex stall_mu_;

};

// Root with dataset "recs": 2 shards of 40 x 4 KiB records (160 KiB), 64 KiB chunks, so each
// shard has chunks 0, 1 (full) and 2 (32 KiB, partial).
struct OriginFixture {
  static constexpr uint64_t kChunk = 64 << 10;
  static constexpr uint64_t kShardBytes = 40 * 4096;

  explicit OriginFixture(serve::ServerOptions so = {}, bool faulty = false, serve::OriginServiceOptions svc = {}) {
    auto d = MakeRecordsDataset(root.path(), "recs", 2, 40, 4096, kChunk);
    REQUIRE(d.ok());
    recs = *d;
    auto f = upstream::FileSource::Open(root.path());
    REQUIRE(f.ok());
    files = std::move(*f);
    faults = std::make_unique<FaultySource>(*files);
    if (so.listen.empty()) so.listen = "127.0.0.1:0";
    ChunkSource& served = faulty ? static_cast<ChunkSource&>(*faults) : *files;
    auto s = serve::StartOriginServer(served, so, svc);
    REQUIRE(s.ok());
    server = std::move(*s);
  }

  std::string Target() const { return "127.0.0.1:" + std::to_string(server->port()); }
  std::string ShardPath(int shard) const {
    char buf[64];
    std::snprintf(buf, sizeof buf, "/recs/shard-%05d.bin", shard);
    return root.path() + buf;
  }

  std::unique_ptr<upstream::GrpcSource> Client(upstream::GrpcSourceOptions o = {}) const {
    if (o.target.empty()) o.target = Target();
    o.backoff_initial = std::chrono::milliseconds(10);
    o.backoff_max = std::chrono::milliseconds(200);
    auto c = upstream::GrpcSource::Create(o);
    REQUIRE(c.ok());
    return std::move(*c);
  }

  TempDir root;
  DatasetPtr recs;
  std::unique_ptr<upstream::FileSource> files;
  std::unique_ptr<FaultySource> faults;
  std::unique_ptr<serve::OriginServer> server;
};

inline ReadOptions Within(std::chrono::milliseconds ms) {
  ReadOptions o;
  o.deadline = std::chrono::steady_clock::now() + ms;
  return o;
}

}  // namespace shardcache::testing
