// Block ranges end to end on loopback: GrpcSource::ReadPieces fetches only the 16 KiB blocks
// (common/hash.h) that cover the pieces, verifies each against the chunk's block table (itself
// checked against the manifest's Merkle root), and never delivers a byte that failed; the Origin
// service refuses ranges that do not lie inside one chunk.
#include <cstring>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "common/hash.h"
#include "daemon/cache/cached_source.h"
#include "shardcache/origin.grpc.pb.h"
#include "testing/eventually.h"
#include "upstream/origin_fixture.h"

using namespace shardcache;
using namespace shardcache::testing;

namespace {

constexpr uint64_t kBlock = kChunkBlockBytes;
constexpr uint64_t kChunk = OriginFixture::kChunk;  // 4 blocks; chunk 2 of a shard has 2

// Pieces of one shard read into buffers of their own.
struct Reads {
  std::vector<ChunkPiece> pieces;
  std::vector<std::string> bufs;

  void Add(uint64_t chunk, uint64_t offset, uint64_t length) {
    bufs.emplace_back(length, '\0');
    pieces.push_back(ChunkPiece{chunk, offset, length, nullptr});
  }
  std::span<const ChunkPiece> Bind() {
    for (size_t i = 0; i < pieces.size(); ++i) pieces[i].dest = reinterpret_cast<uint8_t*>(bufs[i].data());
    return pieces;
  }
  // Every piece holds the shard file's bytes.
  void CheckAgainst(const std::string& shard_path) const {
    for (size_t i = 0; i < pieces.size(); ++i) {
      const ChunkPiece& p = pieces[i];
      CHECK(bufs[i] == FileBytes(shard_path, p.chunk * kChunk + p.offset, p.length));
    }
  }
};

grpc::Status RawRange(const std::string& target, uint64_t chunk, uint64_t chunk_count, uint32_t first_block,
                      uint32_t block_count, std::vector<v1::ChunkMessage>* out = nullptr) {
  auto stub = v1::Origin::NewStub(grpc::CreateChannel(target, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::ReadChunksRequest req;
  req.set_dataset("recs");
  req.set_shard(0);
  req.set_first_chunk(chunk);
  req.set_chunk_count(chunk_count);
  req.set_first_block(first_block);
  req.set_block_count(block_count);
  req.set_want_block_table(true);
  auto reader = stub->ReadChunks(&ctx, req);
  v1::ChunkMessage m;
  while (reader->Read(&m)) {
    if (out) out->push_back(m);
  }
  return reader->Finish();
}

// One ReadChunks call for blocks [first_block, +block_count) of chunk `chunk` of shard 0 (with
// its table) and `more` after it.
grpc::Status RawRanges(const std::string& target, uint64_t chunk, uint32_t first_block, uint32_t block_count,
                       const std::vector<v1::BlockRange>& more, std::vector<v1::ChunkMessage>* out = nullptr) {
  auto stub = v1::Origin::NewStub(grpc::CreateChannel(target, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::ReadChunksRequest req;
  req.set_dataset("recs");
  req.set_first_chunk(chunk);
  req.set_chunk_count(1);
  req.set_first_block(first_block);
  req.set_block_count(block_count);
  req.set_want_block_table(true);
  for (const v1::BlockRange& r : more) *req.add_more_ranges() = r;
  auto reader = stub->ReadChunks(&ctx, req);
  v1::ChunkMessage m;
  while (reader->Read(&m)) {
    if (out) out->push_back(m);
  }
  return reader->Finish();
}

// A few quick fetches of shard 1: the usual time of a block range's and a part's message (and
// of a first answer), against which a stalled stream is judged.
void LearnUsualTimes(ChunkSource& source, const DatasetPtr& d, bool ranges) {
  for (uint64_t c = 0; c < 3; ++c) {
    if (ranges) {
      Reads warm;
      warm.Add(c, 0, 10);
      REQUIRE(source.ReadPieces(d, 1, warm.Bind(), Within(std::chrono::seconds(10))).ok());
    }
    REQUIRE(source.ReadChunk(d, 1, c, Within(std::chrono::seconds(10))).ok());
  }
}

v1::BlockRange Range(uint32_t shard, uint64_t chunk, uint32_t first_block, uint32_t block_count, bool table) {
  v1::BlockRange r;
  r.set_shard(shard);
  r.set_chunk(chunk);
  r.set_first_block(first_block);
  r.set_block_count(block_count);
  r.set_want_block_table(table);
  return r;
}

}  // namespace

TEST_CASE("the origin answers more block ranges on one stream, in order, and refuses bad ones",
          "[origin][blocks][security]") {
  OriginFixture o;
  std::vector<v1::ChunkMessage> got;
  REQUIRE(RawRanges(o.Target(), 0, 1, 1, {Range(1, 2, 0, 2, true), Range(0, 1, 3, 1, false)}, &got).ok());
  REQUIRE(got.size() == 3);
  const std::string shard0 = FileBytes(o.ShardPath(0), 0, OriginFixture::kShardBytes);
  const std::string shard1 = FileBytes(o.ShardPath(1), 0, OriginFixture::kShardBytes);
  CHECK(got[0].chunk() == 0);
  CHECK(got[0].first_block() == 1);
  CHECK(got[0].payload() == shard0.substr(kBlock, kBlock));
  CHECK_FALSE(got[0].block_table().empty());
  CHECK(got[1].chunk() == 2);  // shard 1's short last chunk, whole
  CHECK(got[1].payload() == shard1.substr(2 * kChunk, 2 * kBlock));
  CHECK(RootOfBlockTable(got[1].block_table()) == dataset::ChunkHash(o.recs->manifest, 1, 2));
  CHECK(got[2].chunk() == 1);
  CHECK(got[2].first_block() == 3);
  CHECK(got[2].payload() == shard0.substr(kChunk + 3 * kBlock, kBlock));
  CHECK(got[2].block_table().empty());  // not asked for

  auto refused = [&](const std::vector<v1::BlockRange>& more) {
    return RawRanges(o.Target(), 0, 0, 1, more).error_code() == grpc::StatusCode::INVALID_ARGUMENT;
  };
  CHECK(refused({Range(0, 1, 0, 0, false)}));  // no blocks
  CHECK(refused({Range(0, 2, 1, 2, false)}));  // past the short chunk's 2 blocks
  CHECK(refused({Range(0, 3, 0, 1, false)}));  // no chunk 3
  CHECK(refused({Range(2, 0, 0, 1, false)}));  // no shard 2
  CHECK(refused({Range(0, 0, 0xffffffffu, 0xffffffffu, false)}));
  CHECK(refused(std::vector<v1::BlockRange>(256, Range(0, 0, 0, 1, false))));  // more than 255
  CHECK(RawRanges(o.Target(), 0, 0, 1, std::vector<v1::BlockRange>(255, Range(0, 0, 0, 1, false))).ok());
  // Only after a block range.
  CHECK(RawRange(o.Target(), 0, 1, 0, 0).ok());
  auto stub = v1::Origin::NewStub(grpc::CreateChannel(o.Target(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  v1::ReadChunksRequest whole;
  whole.set_dataset("recs");
  whole.set_chunk_count(1);
  *whole.add_more_ranges() = Range(0, 1, 0, 1, false);
  auto reader = stub->ReadChunks(&ctx, whole);
  v1::ChunkMessage m;
  while (reader->Read(&m)) {
  }
  CHECK(reader->Finish().error_code() == grpc::StatusCode::INVALID_ARGUMENT);
}

TEST_CASE("queued prefetch block ranges ride on one stream together, each chunk's table asked for once",
          "[origin][blocks]") {
  const bool corrupt = GENERATE(false, true);
  OriginFixture o({}, /*faulty=*/corrupt);
  upstream::GrpcSourceOptions co;
  co.connections = 1;  // one stream: the ranges queue behind the first and ride together
  co.max_connections = 1;
  auto client = o.Client(co);
  auto d = client->OpenDataset("recs");
  REQUIRE(d.ok());
  Reads warm;  // chunk 1's first block (and table) on its own, clean
  warm.Add(1, 0, kBlock);
  REQUIRE(client->ReadPieces(*d, 0, warm.Bind(), Within(std::chrono::seconds(20))).ok());
  if (corrupt) {  // FaultySource flips the middle byte (block 2) of chunk 1's next three reads:
    o.faults->corrupt_chunk = 1;  // the origin reads the chunk for each of blocks 1, 2 and 3
    o.faults->corrupt_first = 3;
  }
  // Every other block of shard 0 as a piece of its own (touching pieces stay separate ranges).
  Reads r;
  for (uint64_t c = 0; c < 3; ++c) {
    for (uint64_t b = (c == 1 ? 1 : 0); b < (c < 2 ? 4u : 2u); ++b) r.Add(c, b * kBlock, kBlock);
  }
  ReadOptions ro = Within(std::chrono::seconds(20));
  ro.priority = FetchPriority::kPrefetch;
  std::vector<size_t> done;
  ro.piece_done = [&](size_t i) { done.push_back(i); };
  REQUIRE(client->ReadPieces(*d, 0, r.Bind(), ro).ok());
  r.CheckAgainst(o.ShardPath(0));
  std::sort(done.begin(), done.end());
  CHECK(done == std::vector<size_t>{0, 1, 2, 3, 4, 5, 6, 7, 8});  // each piece reported once
  const auto s = client->stats();
  CHECK(s.block_ranges == 10);
  // The clean read, then the nine ranges on one stream (or the first on its own, when a worker
  // took it before the rest were queued); the corrupt block is counted, and fetched again alone
  // while the rest of its stream is taken.
  CHECK(s.streams >= (corrupt ? 3u : 2u));
  CHECK(s.streams <= (corrupt ? 4u : 3u));
  CHECK(s.checksum_failures == (corrupt ? 1u : 0u));
  // 10 blocks, and each chunk's table once (4 + 4 + 2 entries).
  CHECK(s.payload_bytes == 10 * kBlock + 10 * kBlockHashBytes);
}

TEST_CASE("pieces fetch only the 16 KiB blocks that cover them, byte-exact", "[origin][blocks]") {
  OriginFixture o;
  auto client = o.Client();
  auto d = client->OpenDataset("recs");
  REQUIRE(d.ok());

  Reads r;
  r.Add(0, 100, 50);                    // block 0 of chunk 0 ...
  r.Add(0, 150, kBlock + 20000);        // ... blocks 0-2, sharing block 0: one range [0, 3)
  r.Add(1, 60000, kChunk - 60000);      // the last block of chunk 1, to the chunk's end
  r.Add(2, 20000, 32768 - 20000);       // the last block of the short chunk 2 (32 KiB)
  REQUIRE(client->ReadPieces(*d, 0, r.Bind(), Within(std::chrono::seconds(20))).ok());
  r.CheckAgainst(o.ShardPath(0));

  const auto s = client->stats();
  CHECK(s.chunks == 0);
  CHECK(s.block_ranges == 3);
  // 3 + 1 + 1 blocks, plus each chunk's table once (4 + 4 + 2 entries).
  CHECK(s.payload_bytes == 5 * kBlock + 10 * kBlockHashBytes);

  SECTION("a later range of a chunk reuses its verified table") {
    Reads again;
    again.Add(0, 3 * kBlock + 1, 2);
    REQUIRE(client->ReadPieces(*d, 0, again.Bind(), Within(std::chrono::seconds(20))).ok());
    again.CheckAgainst(o.ShardPath(0));
    CHECK(client->stats().payload_bytes == s.payload_bytes + kBlock);
    CHECK(client->stats().block_ranges == 4);
  }
  SECTION("pieces outside the chunk are refused before anything is fetched") {
    Reads bad;
    bad.Add(2, 30000, 5000);  // past the end of the 32 KiB chunk
    Status st = client->ReadPieces(*d, 0, bad.Bind(), Within(std::chrono::seconds(5)));
    CHECK(st.code() == StatusCode::kInvalidArgument);
    CHECK(client->stats().streams == s.streams);
  }
}

TEST_CASE("a batch's ranges are cut into stripes over idle streams, byte-exact; a range in flight is joined whole",
          "[origin][blocks]") {
  OriginFixture o({}, /*faulty=*/true);
  auto client = o.Client();
  auto d = client->OpenDataset("recs");
  REQUIRE(d.ok());

  SECTION("idle streams: each 4-block range goes as two stripes of 2 blocks") {
    Reads r;
    r.Add(0, 100, kChunk - 200);  // blocks 0-3 of chunk 0: one range ...
    r.Add(1, 0, kChunk);          // ... and all of chunk 1 as a piece: another
    std::vector<int> told(2, 0);
    ReadOptions ro = Within(std::chrono::seconds(20));
    ro.piece_done = [&](size_t i) { ++told.at(i); };
    REQUIRE(client->ReadPieces(*d, 0, r.Bind(), ro).ok());
    r.CheckAgainst(o.ShardPath(0));
    CHECK(told == std::vector<int>{1, 1});  // each piece once, when both its parts are in
    const auto s = client->stats();
    CHECK(s.block_ranges == 4);
    CHECK(s.striped_ranges == 2);
    // 8 blocks, and each chunk's 4-entry table once or, when both stripes asked before either
    // brought it, twice.
    CHECK(s.payload_bytes >= 8 * kBlock + 2 * 4 * kBlockHashBytes);
    CHECK(s.payload_bytes <= 8 * kBlock + 4 * 4 * kBlockHashBytes);
  }
  SECTION("a range a prefetch is fetching already is joined whole, not fetched again in stripes") {
    o.faults->delay_ms = 300;
    Reads warm;
    warm.Add(1, 0, kChunk);
    ReadOptions po = Within(std::chrono::seconds(20));
    po.priority = FetchPriority::kPrefetch;
    Status warmed;
    std::thread prefetch([&] { warmed = client->ReadPieces(*d, 0, warm.Bind(), po); });
    REQUIRE(Eventually([&] { return o.faults->read_calls.load() > 0; }));
    Reads r;
    r.Add(1, 0, kChunk);
    REQUIRE(client->ReadPieces(*d, 0, r.Bind(), Within(std::chrono::seconds(20))).ok());
    prefetch.join();
    REQUIRE(warmed.ok());
    r.CheckAgainst(o.ShardPath(0));
    warm.CheckAgainst(o.ShardPath(0));
    CHECK(client->stats().block_ranges == 1);
    CHECK(client->stats().striped_ranges == 0);
  }
}

TEST_CASE("a block corrupted in transit is counted and refetched, never served", "[origin][blocks][integrity]") {
  OriginFixture o({}, /*faulty=*/true);
  upstream::GrpcSourceOptions co;
  co.max_retries = 3;
  auto client = o.Client(co);
  auto d = client->OpenDataset("recs");
  REQUIRE(d.ok());
  // FaultySource flips the middle byte of chunk 1: block 2.
  o.faults->corrupt_chunk = 1;
  Reads warm;  // a clean range first, so the chunk's table is known
  warm.Add(1, 10, 10);
  REQUIRE(client->ReadPieces(*d, 0, warm.Bind(), Within(std::chrono::seconds(20))).ok());

  SECTION("corrupt twice, then good") {
    o.faults->corrupt_first = 2;
    Reads r;
    r.Add(1, 2 * kBlock + 5, 100);
    REQUIRE(client->ReadPieces(*d, 0, r.Bind(), Within(std::chrono::seconds(20))).ok());
    r.CheckAgainst(o.ShardPath(0));
    CHECK(client->stats().checksum_failures == 2);
  }
  SECTION("corrupt every time: DataLoss naming the block, and no byte delivered") {
    o.faults->corrupt_first = 1000;
    Reads r;
    r.Add(1, 2 * kBlock + 5, 100);
    Status st = client->ReadPieces(*d, 0, r.Bind(), Within(std::chrono::seconds(20)));
    CHECK(st.code() == StatusCode::kDataLoss);
    CHECK_THAT(st.message(), Catch::Contains("chunk 1") && Catch::Contains("block 2"));
    CHECK(r.bufs[0] == std::string(100, '\0'));
    CHECK(client->stats().checksum_failures == 4);
  }
  SECTION("a range without the bad block is served from the same corrupt chunk") {
    o.faults->corrupt_first = 1000;
    Reads r;
    r.Add(1, kBlock, kBlock);  // block 1 only
    REQUIRE(client->ReadPieces(*d, 0, r.Bind(), Within(std::chrono::seconds(20))).ok());
    r.CheckAgainst(o.ShardPath(0));
    CHECK(client->stats().checksum_failures == 0);
  }
}

TEST_CASE("a block table that does not match the manifest's root is refused", "[origin][blocks][integrity]") {
  OriginFixture o({}, /*faulty=*/true);
  upstream::GrpcSourceOptions co;
  co.max_retries = 2;
  auto client = o.Client(co);
  auto d = client->OpenDataset("recs");
  REQUIRE(d.ok());
  // No table known yet: the origin's table comes from its corrupt copy of the chunk.
  o.faults->corrupt_chunk = 1;
  o.faults->corrupt_first = 1000;
  Reads r;
  r.Add(1, 0, 10);
  Status st = client->ReadPieces(*d, 0, r.Bind(), Within(std::chrono::seconds(20)));
  CHECK(st.code() == StatusCode::kDataLoss);
  CHECK_THAT(st.message(), Catch::Contains("block table") && Catch::Contains("chunk 1"));
  CHECK(client->stats().checksum_failures == 3);
  CHECK(r.bufs[0] == std::string(10, '\0'));
}

TEST_CASE("readers of one cold block range share one fetch", "[origin][blocks][single_flight]") {
  OriginFixture o({}, /*faulty=*/true);
  o.faults->delay_ms = 300;
  auto client = o.Client();
  auto d = client->OpenDataset("recs");
  REQUIRE(d.ok());
  std::atomic<int> ok{0};
  std::vector<std::thread> readers;
  for (int i = 0; i < 8; ++i) {
    readers.emplace_back([&] {
      Reads r;
      r.Add(1, kBlock, 100);
      if (client->ReadPieces(*d, 1, r.Bind(), Within(std::chrono::seconds(10))).ok() &&
          r.bufs[0] == FileBytes(o.ShardPath(1), kChunk + kBlock, 100)) {
        ok.fetch_add(1);
      }
    });
  }
  for (auto& t : readers) t.join();
  CHECK(ok.load() == 8);
  CHECK(o.faults->read_calls.load() == 1);
  CHECK(client->stats().block_ranges == 1);
}

TEST_CASE("the origin serves a block range with its table and refuses ranges outside one chunk",
          "[origin][blocks][security]") {
  OriginFixture o;
  std::vector<v1::ChunkMessage> got;
  REQUIRE(RawRange(o.Target(), 1, 1, 1, 2, &got).ok());
  REQUIRE(got.size() == 1);
  CHECK(got[0].first_block() == 1);
  CHECK(got[0].raw_bytes() == 2 * kBlock);
  const std::string chunk = FileBytes(o.ShardPath(0), kChunk, kChunk);
  CHECK(got[0].block_table() == BlockTable(chunk.data(), chunk.size()));
  CHECK(RootOfBlockTable(got[0].block_table()) == dataset::ChunkHash(o.recs->manifest, 0, 1));

  CHECK(RawRange(o.Target(), 0, 2, 0, 1).error_code() == grpc::StatusCode::INVALID_ARGUMENT);  // two chunks
  CHECK(RawRange(o.Target(), 0, 1, 3, 2).error_code() == grpc::StatusCode::INVALID_ARGUMENT);  // past block 3
  CHECK(RawRange(o.Target(), 2, 1, 2, 1).error_code() == grpc::StatusCode::INVALID_ARGUMENT);  // chunk 2: 2 blocks
  CHECK(RawRange(o.Target(), 0, 1, 1, 0).error_code() == grpc::StatusCode::INVALID_ARGUMENT);  // no count
  CHECK(RawRange(o.Target(), 0, 1, 0xffffffffu, 0xffffffffu).error_code() == grpc::StatusCode::INVALID_ARGUMENT);
}

TEST_CASE("a node reading pieces-only fetches block ranges and keeps the pieces as runs, not their chunks", "[origin][blocks][cache]") {
  OriginFixture o;
  TempDir nvme;
  cache::CacheOptions co;
  co.dir = nvme.path();
  co.size_bytes = 64ull << 20;
  co.segment_bytes = 4ull << 20;
  auto node = cache::CachedSource::Open(co, o.Client());
  INFO(node.status().ToString());
  REQUIRE(node.ok());
  auto d = (*node)->OpenDataset("recs");
  REQUIRE(d.ok());
  ReadOptions ro = Within(std::chrono::seconds(20));
  ro.whole_chunks = false;
  const std::vector<ChunkPiece> asked{{0, 5, 4096, nullptr}, {1, 40000, 4096, nullptr}};
  CHECK_FALSE((*node)->HoldsPieces(*d, 0, asked));
  for (int round = 0; round < 2; ++round) {
    Reads r;
    r.Add(0, 5, 4096);
    r.Add(1, 40000, 4096);
    REQUIRE((*node)->ReadPieces(*d, 0, r.Bind(), ro).ok());
    r.CheckAgainst(o.ShardPath(0));
  }
  CHECK((*node)->HoldsPieces(*d, 0, asked));
  CHECK_FALSE((*node)->HoldsPieces(*d, 0, std::vector<ChunkPiece>{{1, 40000, 4097, nullptr}}));  // not that run
  (*node)->Flush();
  const auto s = (*node)->Stats();
  CHECK(s.misses == 2);  // the second round was served by the runs the first one kept
  CHECK(s.run_hits == 2);
  CHECK(s.runs_kept == 2);
  CHECK(s.upstream_fetched_chunks == 0);  // no chunk was fetched whole
  CHECK(s.nvme.entries == 2);
  CHECK(s.served_upstream_bytes == 2 * 4096);
}

TEST_CASE("a demand fetch stuck on a stalled stream is hedged on another; the first verified copy wins",
          "[origin][blocks][hedge]") {
  OriginFixture o({}, /*faulty=*/true);
  auto client = o.Client();
  auto d = client->OpenDataset("recs");
  REQUIRE(d.ok());
  using Clock = std::chrono::steady_clock;
  const bool range = GENERATE(false, true);
  LearnUsualTimes(*client, *d, /*ranges=*/true);
  o.faults->stall_next_ms = 4000;  // the next stream's first message comes 4 s late
  const uint64_t ranges_before = client->stats().block_ranges;
  const auto t0 = Clock::now();
  if (range) {
    Reads r;
    r.Add(1, kBlock + 3, 5000);
    REQUIRE(client->ReadPieces(*d, 0, r.Bind(), Within(std::chrono::seconds(10))).ok());
    r.CheckAgainst(o.ShardPath(0));
  } else {
    auto c = client->ReadChunk(*d, 0, 1, Within(std::chrono::seconds(10)));
    REQUIRE(c.ok());
    CHECK(ChunkBytes(*c) == FileBytes(o.ShardPath(0), kChunk, kChunk));
  }
  const double took = std::chrono::duration<double>(Clock::now() - t0).count();
  INFO("took " << took << " s");
  // The hedge's floor (0.2 s for a range, 1 s for a chunk) and a quick fetch, not the 4 s stall.
  CHECK(took < 1.5);
  CHECK(client->stats().hedges == 1);
  CHECK(client->stats().range_hedges == (range ? 1 : 0));
  // A whole chunk's hedge runs striped: a block range per block here (a chunk of 4 blocks; at
  // most kStripes ranges).
  static_assert(kChunk / kBlock <= upstream::GrpcSource::kStripes);
  CHECK(client->stats().block_ranges - ranges_before == (range ? 1 : kChunk / kBlock));
  CHECK(client->stats().checksum_failures == 0);
  // The winner ends the stalled original: that is no failure of the upstream, so nothing is
  // retried (nor counted towards an outage).
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  CHECK(client->stats().retries == 0);
  // The stalled stream's connection is closed, not given to the next fetch.
  CHECK(client->stats().stalled_connections == 1);
}

TEST_CASE("a hedge stuck as well is followed by another; a stall behind a stall costs a fraction of a second",
          "[origin][blocks][hedge]") {
  OriginFixture o({}, /*faulty=*/true);
  auto client = o.Client();
  auto d = client->OpenDataset("recs");
  REQUIRE(d.ok());
  LearnUsualTimes(*client, *d, /*ranges=*/true);
  const int stalled = GENERATE(2, 3);  // the original and one or two hedges
  o.faults->stall_next_ms = 4000;
  o.faults->stall_reads = stalled;
  const auto t0 = std::chrono::steady_clock::now();
  Reads r;
  r.Add(1, kBlock + 3, 5000);
  REQUIRE(client->ReadPieces(*d, 0, r.Bind(), Within(std::chrono::seconds(10))).ok());
  r.CheckAgainst(o.ShardPath(0));
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  INFO("took " << took << " s; " << stalled << " streams stalled for 4 s");
  // One floor (0.2 s) per stuck copy and a quick fetch. With one hedge only it took the stall.
  CHECK(took < 0.4 * stalled + 0.5);
  CHECK(client->stats().hedges == static_cast<uint64_t>(stalled));
  CHECK(client->stats().range_hedges == static_cast<uint64_t>(stalled));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  CHECK(client->stats().stalled_connections == static_cast<uint64_t>(stalled));
  CHECK(client->stats().retries == 0);
  CHECK(client->stats().checksum_failures == 0);
}

TEST_CASE("a prefetch stuck on a stalled stream is hedged once a demand read waits for its chunk",
          "[origin][hedge][cache]") {
  OriginFixture o({}, /*faulty=*/true);
  const bool through_cache = GENERATE(false, true);
  TempDir nvme;
  // One stream: the stuck prefetch fills the limit, so no stream is spare (see below).
  upstream::GrpcSourceOptions one;
  one.connections = 1;
  std::unique_ptr<upstream::GrpcSource> client = o.Client(one);
  upstream::GrpcSource* grpc = client.get();
  std::shared_ptr<ChunkSource> node;
  if (through_cache) {
    cache::CacheOptions co;
    co.dir = nvme.path();
    co.size_bytes = 64ull << 20;
    co.segment_bytes = 4ull << 20;
    auto opened = cache::CachedSource::Open(co, std::move(client));
    REQUIRE(opened.ok());
    node = std::move(*opened);
  } else {
    node = std::move(client);
  }
  auto d = node->OpenDataset("recs");
  REQUIRE(d.ok());
  LearnUsualTimes(*node, *d, /*ranges=*/false);
  o.faults->stall_next_ms = 4000;
  ReadOptions ahead = Within(std::chrono::seconds(10));
  ahead.priority = FetchPriority::kPrefetch;
  std::thread prefetch([&] { CHECK(node->ReadChunk(*d, 0, 1, ahead).ok()); });
  // Alone, a stuck prefetch is left to its stream: no hedge while nobody waits for it.
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  CHECK(grpc->stats().hedges == 0);
  const auto t0 = std::chrono::steady_clock::now();
  auto c = node->ReadChunk(*d, 0, 1, Within(std::chrono::seconds(10)));
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  prefetch.join();
  REQUIRE(c.ok());
  CHECK(ChunkBytes(*c) == FileBytes(o.ShardPath(0), kChunk, kChunk));
  INFO("the demand read took " << took << " s; the stall had 2.5 s left");
  CHECK(took < 1.5);
  CHECK(grpc->stats().hedges == 1);
}

TEST_CASE("a stream stuck on a stalled connection gives its place under the stream limit to queued work",
          "[origin][hedge]") {
  OriginFixture o({}, /*faulty=*/true);
  upstream::GrpcSourceOptions opts;
  opts.connections = 1;      // a limit of one stream (nothing waits while the usual times are
  opts.max_connections = 4;  // learnt, so it stays there), with slots to spare
  auto client = o.Client(opts);
  auto d = client->OpenDataset("recs");
  REQUIRE(d.ok());
  LearnUsualTimes(*client, *d, /*ranges=*/false);
  o.faults->stall_next_ms = 4000;
  ReadOptions ahead = Within(std::chrono::seconds(10));
  ahead.priority = FetchPriority::kPrefetch;
  std::thread stalled([&] {
    auto c = client->ReadChunk(*d, 0, 1, ahead);
    REQUIRE(c.ok());
    CHECK(ChunkBytes(*c) == FileBytes(o.ShardPath(0), kChunk, kChunk));
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // its stream runs, stalled
  const auto t0 = std::chrono::steady_clock::now();
  auto c = client->ReadChunk(*d, 0, 0, ahead);  // queued behind it, at the limit
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  REQUIRE(c.ok());
  CHECK(ChunkBytes(*c) == FileBytes(o.ShardPath(0), 0, kChunk));
  INFO("the queued prefetch took " << took << " s; the stall lasts 4 s");
  // Once found stuck (half a second for a whole chunk that has not answered), the stalled
  // stream no longer holds the only place: the queued chunk runs beside it, not after it.
  CHECK(took < 2.5);
  // Beside it, not as a copy of it: nobody waits for the stalled chunk.
  CHECK(client->stats().hedges == 0);
  stalled.join();
}

TEST_CASE("with streams to spare, a stuck prefetch of a block range is hedged before any read waits for it",
          "[origin][blocks][hedge]") {
  OriginFixture o({}, /*faulty=*/true);
  auto client = o.Client();  // 32 streams to start with: one running leaves most spare
  auto d = client->OpenDataset("recs");
  REQUIRE(d.ok());
  LearnUsualTimes(*client, *d, /*ranges=*/true);
  const bool range = GENERATE(true, false);
  o.faults->stall_next_ms = 4000;
  ReadOptions ahead = Within(std::chrono::seconds(10));
  ahead.priority = FetchPriority::kPrefetch;
  const auto t0 = std::chrono::steady_clock::now();
  std::thread late([&] {
    if (range) return;
    // A whole chunk's copy would cost its length again: hedged only once a read waits for it.
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    CHECK(client->stats().hedges == 0);
    CHECK(client->ReadChunk(*d, 0, 1, Within(std::chrono::seconds(10))).ok());
  });
  if (range) {
    Reads r;
    r.Add(1, kBlock + 3, 5000);
    REQUIRE(client->ReadPieces(*d, 0, r.Bind(), ahead).ok());
    r.CheckAgainst(o.ShardPath(0));
  } else {
    auto c = client->ReadChunk(*d, 0, 1, ahead);
    REQUIRE(c.ok());
    CHECK(ChunkBytes(*c) == FileBytes(o.ShardPath(0), kChunk, kChunk));
  }
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  late.join();
  INFO("the prefetch took " << took << " s; its stream stalled for 4 s");
  CHECK(took < (range ? 1.5 : 3.0));
  CHECK(client->stats().hedges == 1);
  CHECK(client->stats().range_hedges == (range ? 1 : 0));
}

TEST_CASE("a read striped over streams, one stalled and one reset, arrives byte-exact and on time",
          "[origin][hedge][faults]") {
  OriginFixture o({}, /*faulty=*/true);
  upstream::GrpcSourceOptions co;
  co.chunks_per_stream = 1;  // each chunk on a stream of its own
  auto client = o.Client(co);
  auto d = client->OpenDataset("recs");
  REQUIRE(d.ok());
  REQUIRE(client->ReadChunks(*d, 1, 0, 3, Within(std::chrono::seconds(10)), [](uint64_t, const ChunkPtr&) {
    return Status::Ok();
  }).ok());  // the usual time of a chunk's message
  o.faults->stall_next_ms = 4000;
  o.faults->reset_next = true;
  const auto t0 = std::chrono::steady_clock::now();
  std::string got;
  REQUIRE(client->ReadChunks(*d, 0, 0, 3, Within(std::chrono::seconds(10)), [&](uint64_t, const ChunkPtr& c) {
    got += ChunkBytes(c);
    return Status::Ok();
  }).ok());
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  CHECK(got == FileBytes(o.ShardPath(0), 0, OriginFixture::kShardBytes));
  INFO("took " << took << " s");
  CHECK(took < 2.5);
  CHECK(client->stats().hedges == 1);
  CHECK(client->stats().retries >= 1);
}

namespace {

// An Origin that serves the fixture's "recs" from its files, sending whole chunks in the parts
// the reader asks for (or whole, as servers before part_blocks did), and that can stall once
// mid-chunk: the first whole-chunk stream of chunk `stall_chunk` sends `stall_after_parts`
// parts, then nothing until the reader gives up on it.
class PartsOrigin final : public v1::Origin::Service {
 public:
  PartsOrigin(const OriginFixture& o, bool send_parts) : o_(o), send_parts_(send_parts) {
    grpc::ServerBuilder b;
    b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    b.RegisterService(this);
    server_ = b.BuildAndStart();
    REQUIRE(server_ != nullptr);
  }
  ~PartsOrigin() override { server_->Shutdown(std::chrono::system_clock::now()); }
  std::string Target() const { return "127.0.0.1:" + std::to_string(port_); }
  // A client of this origin asking for parts of one block, with "recs" open.
  std::unique_ptr<upstream::GrpcSource> Client(DatasetPtr* recs) const {
    upstream::GrpcSourceOptions opts;
    opts.target = Target();
    opts.part_blocks = 1;
    auto client = o_.Client(opts);
    auto d = client->OpenDataset("recs");
    REQUIRE(d.ok());
    *recs = *d;
    return client;
  }

  std::atomic<int64_t> stall_chunk{-1};
  std::atomic<int> stall_after_parts{0};
  std::atomic<int> whole_streams{0}, range_streams{0};

  grpc::Status GetManifest(grpc::ServerContext*, const v1::GetManifestRequest*, v1::GetManifestResponse* r) override {
    r->set_manifest(o_.recs->manifest_bytes);
    r->set_version(o_.recs->version);
    return grpc::Status::OK;
  }

  grpc::Status ReadChunks(grpc::ServerContext* ctx, const v1::ReadChunksRequest* req,
                          grpc::ServerWriter<v1::ChunkMessage>* w) override {
    const std::string shard = FileBytes(o_.ShardPath(static_cast<int>(req->shard())), 0, UINT64_MAX);
    for (uint64_t c = req->first_chunk(); c < req->first_chunk() + req->chunk_count(); ++c) {
      const std::string chunk = shard.substr(c * kChunk, kChunk);
      if (req->block_count() > 0) {
        ++range_streams;
        v1::ChunkMessage m = Message(c, chunk, req->first_block(), req->block_count() * kBlock);
        if (req->want_block_table()) m.set_block_table(BlockTable(chunk.data(), chunk.size()));
        w->Write(m);
        continue;
      }
      ++whole_streams;
      const uint64_t part = send_parts_ && req->part_blocks() > 0 ? req->part_blocks() * kBlock : chunk.size();
      int sent = 0;
      for (uint64_t at = 0; at < chunk.size(); at += part, ++sent) {
        if (static_cast<int64_t>(c) == stall_chunk.load() && sent == stall_after_parts.load()) {
          stall_chunk = -1;  // once
          while (!ctx->IsCancelled()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
          return grpc::Status::CANCELLED;
        }
        w->Write(Message(c, chunk, static_cast<uint32_t>(at / kBlock), part));
      }
    }
    return grpc::Status::OK;
  }

 private:
  static v1::ChunkMessage Message(uint64_t c, const std::string& chunk, uint32_t first_block, uint64_t max_bytes) {
    const uint64_t at = first_block * kBlock;
    const std::string bytes = chunk.substr(at, std::min<uint64_t>(max_bytes, chunk.size() - at));
    v1::ChunkMessage m;
    m.set_chunk(c);
    m.set_hash(HashBytes(chunk.data(), chunk.size()).ToBytes());
    m.set_codec(v1::RAW);
    m.set_raw_bytes(bytes.size());
    m.set_payload(bytes);
    m.set_first_block(first_block);
    return m;
  }

  const OriginFixture& o_;
  const bool send_parts_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
};

}  // namespace

TEST_CASE("whole chunks arrive in parts, or whole from an origin that sends no parts, byte-exact",
          "[origin][parts]") {
  OriginFixture o;
  const bool parts = GENERATE(false, true);
  PartsOrigin origin(o, parts);
  DatasetPtr d;
  auto client = origin.Client(&d);
  for (uint64_t c = 0; c < 3; ++c) {
    auto got = client->ReadChunk(d, 0, c, Within(std::chrono::seconds(10)));
    REQUIRE(got.ok());
    CHECK(ChunkBytes(*got) == FileBytes(o.ShardPath(0), c * kChunk, kChunk));
  }
  CHECK(client->stats().chunks == 3);
  CHECK(client->stats().checksum_failures == 0);

  // The Origin service itself splits as asked: 4 parts of 1 block, in order, back to back.
  auto stub = v1::Origin::NewStub(grpc::CreateChannel(o.Target(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  v1::ReadChunksRequest req;
  req.set_dataset("recs");
  req.set_shard(0);
  req.set_first_chunk(1);
  req.set_chunk_count(1);
  req.set_part_blocks(1);
  auto reader = stub->ReadChunks(&ctx, req);
  v1::ChunkMessage m;
  std::string joined;
  std::vector<uint32_t> firsts;
  while (reader->Read(&m)) {
    CHECK(m.chunk() == 1);
    firsts.push_back(m.first_block());
    joined += m.payload();  // RAW: incompressible records
  }
  REQUIRE(reader->Finish().ok());
  CHECK(firsts == std::vector<uint32_t>{0, 1, 2, 3});
  CHECK(joined == FileBytes(o.ShardPath(0), kChunk, kChunk));
}

TEST_CASE("a stream stalled mid-chunk is hedged for the missing blocks only; the chunk arrives byte-exact",
          "[origin][parts][hedge]") {
  OriginFixture o;
  PartsOrigin origin(o, /*send_parts=*/true);
  DatasetPtr d;
  auto client = origin.Client(&d);
  for (uint64_t c = 0; c < 3; ++c) {  // the usual time of a part
    REQUIRE(client->ReadChunk(d, 1, c, Within(std::chrono::seconds(10))).ok());
  }
  origin.stall_chunk = 1;
  origin.stall_after_parts = 2;  // blocks 0 and 1 arrive, then the stream goes silent
  const uint64_t ranges_before = client->stats().block_ranges;
  const auto t0 = std::chrono::steady_clock::now();
  auto got = client->ReadChunk(d, 0, 1, Within(std::chrono::seconds(10)));
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  REQUIRE(got.ok());
  CHECK(ChunkBytes(*got) == FileBytes(o.ShardPath(0), kChunk, kChunk));
  INFO("took " << took << " s");
  CHECK(took < 2.0);  // the 0.5 s floor and a quick fetch; the stall itself never ends
  CHECK(client->stats().hedges == 1);
  // Blocks 2 and 3, one range each; blocks 0 and 1 came from the stalled stream's parts.
  CHECK(client->stats().block_ranges - ranges_before == 2);
  CHECK(client->stats().checksum_failures == 0);
}
