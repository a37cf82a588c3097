// Tests of sub-chunk reads: NvmeStore::ReadPieces (only the covered 64 KiB blocks and one
// block-table page are read, verified block by block; whole chunks against the manifest hash),
// CachedSource::ReadPieces and Prefetch across the tiers, the non-blocking
// CachedSource::ReadPiecesFromMemory (DRAM and write queue only; all or nothing) and Holds (no
// I/O), and the ChunkSource::ReadPieces default. Every piece is compared byte for byte with the
// bytes it was cut from, and the bytes around each destination must stay untouched. Corruption
// is injected by flipping bytes in the segment files at the extent offsets the RocksDB index
// reports.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "daemon/cache/cached_source.h"
#include "daemon/cache/index_db.h"
#include "daemon/cache/nvme_store.h"
#include "daemon/cache/segment_file.h"
#include "tests/cache/cache_test_util.h"
#include "tests/cache/fake_upstream.h"
#include "testing/temp_dir.h"

using namespace shardcache;
using namespace shardcache::cache;
using namespace shardcache::testing;

namespace {

using Clock = std::chrono::steady_clock;

// 64 full blocks and a last block of 1234 bytes; the data ends mid-page.
constexpr uint64_t kOddChunkBytes = (4ull << 20) + 1234;
constexpr uint64_t kBlock = kVerifyBlockBytes;
constexpr uint8_t kGuard = 0xEE;

// ---------------------------------------------------------------------------------------------
// Destinations

// One piece to read: bytes [offset, offset + length) of chunk `chunk` (an index into the
// caller's list of chunks) into a destination `misalign` bytes past a 4 KiB boundary.
struct Ask {
  size_t chunk = 0;
  uint64_t offset = 0;
  uint64_t length = 0;
  uint64_t misalign = 0;
};

std::string Describe(const Ask& a) {
  return "chunk #" + std::to_string(a.chunk) + " bytes [" + std::to_string(a.offset) + ", " +
         std::to_string(a.offset + a.length) + ") misalign " + std::to_string(a.misalign);
}

// Destinations of a list of asks in one buffer: each starts `misalign` bytes past a 4 KiB
// boundary and is followed by at least 64 guard bytes; every byte outside the destinations
// holds kGuard, which a read must leave alone.
class Slots {
 public:
  explicit Slots(const std::vector<Ask>& asks) {
    uint64_t at = 0;
    for (const Ask& a : asks) {
      at = AlignUp(at, kDirectIoAlign) + a.misalign;
      spans_.emplace_back(at, a.length);
      at += a.length + 64;
    }
    buf_ = AlignedBuffer(AlignUp(at, kDirectIoAlign) + kDirectIoAlign);
    std::memset(buf_.data(), kGuard, buf_.capacity());
  }
  uint8_t* dest(size_t i) { return buf_.data() + spans_[i].first; }
  // Bytes outside every destination that no longer hold kGuard.
  uint64_t GuardDamage() const {
    uint64_t bad = 0, at = 0;
    auto check = [&](uint64_t from, uint64_t to) {
      for (uint64_t k = from; k < to; ++k) bad += buf_.data()[k] != kGuard;
    };
    for (const auto& [start, length] : spans_) {
      check(at, start);
      at = std::max(at, start + length);
    }
    check(at, buf_.capacity());
    return bad;
  }

 private:
  AlignedBuffer buf_;
  std::vector<std::pair<uint64_t, uint64_t>> spans_;  // (start, length)
};

// Per ask: "" when it hit with the right bytes, else what went wrong.
struct Outcome {
  std::vector<bool> hit;
  std::string wrong;           // asks that hit with wrong bytes, one per line
  uint64_t guard_damage = 0;
  size_t hits() const { return static_cast<size_t>(std::count(hit.begin(), hit.end(), true)); }
  // Asks that missed, one per line.
  std::string Misses(const std::vector<Ask>& asks) const {
    std::string out;
    for (size_t i = 0; i < asks.size(); ++i) {
      if (!hit[i]) out += Describe(asks[i]) + "\n";
    }
    return out;
  }
};

// ---------------------------------------------------------------------------------------------
// NvmeStore fixtures

struct Stored {
  ChunkKey key;
  ChunkPtr chunk;
};

ChunkPtr PatternChunk(uint64_t length, uint64_t seed) {
  auto c = std::make_shared<Chunk>();
  c->bytes = AlignedBuffer(length);
  FillSyntheticChunk(seed, 7, seed, c->bytes.data(), length);
  c->hash = ChunkDigest(c->bytes.data(), length);
  return c;
}

// Room for three odd chunks per segment, plus slack that is not a fourth.
CacheOptions StoreOptions(const std::string& dir) {
  auto o = SmallCacheOptions(dir, 256ull << 20);
  o.segment_bytes = 3 * ExtentBytes(kOddChunkBytes) + (1ull << 20);
  return o;
}

std::unique_ptr<NvmeStore> OpenStore(const CacheOptions& o) {
  auto s = NvmeStore::Open(o, nullptr);
  REQUIRE(s.ok());
  return std::move(*s);
}

// Stores `count` chunks of `length` bytes (chunk i of version "pieces-v1", shard 0) and waits
// until they are written and committed.
std::vector<Stored> StoreChunks(NvmeStore& store, const std::vector<uint64_t>& lengths) {
  std::vector<Stored> out;
  for (size_t i = 0; i < lengths.size(); ++i) {
    Stored s{MakeChunkKey("pieces-v1", 0, i), PatternChunk(lengths[i], 100 + i)};
    REQUIRE(store.Insert(s.key, s.chunk, Clock::now() + std::chrono::seconds(30)));
    out.push_back(std::move(s));
  }
  store.Flush();
  for (const auto& s : out) REQUIRE(store.Contains(s.key));
  return out;
}

NvmePiece MakeNvmePiece(const Stored& s, uint64_t offset, uint64_t length, uint8_t* dest) {
  return NvmePiece{s.key, s.chunk->bytes.size(), s.chunk->hash, offset, length, dest};
}

// All asks in one NvmeStore::ReadPieces call.
Outcome ReadNvme(NvmeStore& store, const std::vector<Stored>& chunks, const std::vector<Ask>& asks) {
  Slots slots(asks);
  std::vector<NvmePiece> pieces;
  for (size_t i = 0; i < asks.size(); ++i) {
    pieces.push_back(MakeNvmePiece(chunks[asks[i].chunk], asks[i].offset, asks[i].length, slots.dest(i)));
  }
  Outcome out;
  out.hit = store.ReadPieces(pieces);
  // No REQUIRE here: readers run on threads, and Catch2 asserts on the test's thread only.
  if (out.hit.size() != asks.size()) {
    out.wrong = "ReadPieces answered " + std::to_string(out.hit.size()) + " of " + std::to_string(asks.size()) +
                " pieces\n";
    out.hit.resize(asks.size(), false);
    return out;
  }
  for (size_t i = 0; i < asks.size(); ++i) {
    const Ask& a = asks[i];
    if (out.hit[i] && a.length > 0 &&
        std::memcmp(slots.dest(i), chunks[a.chunk].chunk->bytes.data() + a.offset, a.length) != 0) {
      out.wrong += Describe(a) + "\n";
    }
  }
  // A miss may leave garbage in its own destination, never outside it.
  out.guard_damage = slots.GuardDamage();
  return out;
}

// Where the index says a chunk's extent starts.
EntryLocation WhereStored(IndexDb& db, const ChunkKey& key) {
  std::optional<EntryLocation> found;
  REQUIRE(db.ForEachEntry(
                [&](const EntryLocation& loc, const EntryRecord& e) {
                  if (e.version_high == key.version.high && e.version_low == key.version.low &&
                      e.shard == key.shard && e.chunk == key.chunk) {
                    found = loc;
                  }
                },
                [](const EntryLocation&) {})
              .ok());
  REQUIRE(found.has_value());
  return *found;
}

// Flips every bit of one byte of a segment file (past the page cache: the store reads O_DIRECT).
void FlipByte(const std::string& dir, uint32_t segment, uint64_t offset) {
  const std::string path = SegmentFile::PathFor(dir, segment);
  int fd = open(path.c_str(), O_RDWR);
  REQUIRE(fd >= 0);
  uint8_t b = 0;
  REQUIRE(pread(fd, &b, 1, static_cast<off_t>(offset)) == 1);
  b ^= 0xff;
  REQUIRE(pwrite(fd, &b, 1, static_cast<off_t>(offset)) == 1);
  REQUIRE(fsync(fd) == 0);
  close(fd);
}

// Flips a byte of the chunk's data at `offset_in_chunk`.
void CorruptData(const std::string& dir, IndexDb& db, const ChunkKey& key, uint64_t offset_in_chunk) {
  const EntryLocation loc = WhereStored(db, key);
  FlipByte(dir, loc.segment, loc.offset + offset_in_chunk);
}

// Flips a byte of the block table entry of `block` (the table follows the data padded to 4 KiB).
void CorruptTable(const std::string& dir, IndexDb& db, const ChunkKey& key, uint64_t length, uint64_t block) {
  const EntryLocation loc = WhereStored(db, key);
  FlipByte(dir, loc.segment, loc.offset + AlignUp(length, kDirectIoAlign) + block * sizeof(uint64_t) + 3);
}

// Random pieces of a chunk of `length` bytes: arbitrary offsets and lengths (up to 300 KiB),
// and block-aligned runs of whole blocks; destinations aligned or not.
std::vector<Ask> RandomAsks(size_t chunk, uint64_t length, size_t n, std::mt19937_64& rng) {
  static constexpr uint64_t kMisalign[] = {0, 1, 7, 512, 4095};
  std::vector<Ask> out;
  for (size_t i = 0; i < n; ++i) {
    Ask a;
    a.chunk = chunk;
    if (i % 4 == 3) {
      const uint64_t blocks = (length + kBlock - 1) / kBlock;
      const uint64_t b = rng() % blocks;
      a.offset = b * kBlock;
      a.length = std::min<uint64_t>((1 + rng() % 4) * kBlock, length - a.offset);
      a.misalign = 0;
    } else {
      a.offset = rng() % length;
      a.length = 1 + rng() % std::min<uint64_t>(length - a.offset, 300 << 10);
      a.misalign = kMisalign[rng() % std::size(kMisalign)];
    }
    out.push_back(a);
  }
  return out;
}

// Every shape of piece of chunk #`chunk` (`length` bytes) the read path distinguishes.
std::vector<Ask> EdgeAsks(size_t chunk, uint64_t length) {
  const uint64_t last_block = (length - 1) / kBlock * kBlock;
  return {
      {chunk, 0, length, 0},                       // whole, aligned dest
      {chunk, 0, length, 1},                       // whole, unaligned dest (bounce)
      {chunk, 0, 1, 0},                            // 1 byte at the start
      {chunk, length - 1, 1, 3},                   // 1 byte at the very end
      {chunk, length - 100, 100, 0},               // the tail
      {chunk, last_block, length - last_block, 0}, // exactly the last (short) block
      {chunk, kBlock - 10, 20, 5},                 // across a block boundary
      {chunk, 100000, std::min<uint64_t>(1000000, length - 100000), 9},  // across many blocks
      {chunk, 0, kBlock, 0},                       // first block, aligned (direct partial)
      {chunk, 2 * kBlock, 3 * kBlock, 0},          // whole blocks, aligned (direct partial)
      {chunk, 2 * kBlock, 3 * kBlock, 1},          // the same, unaligned (bounce)
      {chunk, 3 * kBlock + 17, kBlock, 0},         // aligned dest, unaligned offset
  };
}

// ---------------------------------------------------------------------------------------------
// CachedSource fixtures

// One shard of 8 chunks: 7 of 1 MiB + 4321 bytes (odd, not block aligned) and a last one of
// 33721 bytes.
SyntheticDatasetOptions PiecesDataset() {
  SyntheticDatasetOptions o;
  o.name = "pieces";
  o.shards = 1;
  o.record_bytes = 1234;
  o.shard_bytes = 1234 * 6000;
  o.chunk_bytes = (1ull << 20) + 4321;
  o.seed = 42;
  return o;
}

struct CacheFixture {
  SyntheticDatasetOptions dso = PiecesDataset();
  DatasetPtr dataset = MakeSyntheticDataset(dso);
  FakeUpstream* upstream = nullptr;  // owned by `cache`
  std::unique_ptr<CachedSource> cache;

  explicit CacheFixture(const CacheOptions& o) { Open(o); }
  void Open(const CacheOptions& o) {
    cache.reset();
    auto up = std::make_unique<FakeUpstream>();
    up->AddDataset(dso, dataset);
    upstream = up.get();
    auto opened = CachedSource::Open(o, std::move(up));
    REQUIRE(opened.ok());
    cache = std::move(*opened);
  }
  uint64_t Length(uint64_t chunk) const { return dataset::ChunkLength(dataset->manifest, 0, chunk); }
  ChunkPtr Expected(uint64_t chunk) const { return MakeSyntheticChunk(dso, dataset, 0, chunk); }
};

// All asks (Ask::chunk = chunk index in shard 0) in one ReadPieces call on `source`.
Outcome ReadSource(ChunkSource& source, const CacheFixture& f, const std::vector<Ask>& asks, Status* status,
                   const ReadOptions& options = ReadOptions()) {
  Slots slots(asks);
  std::vector<ChunkPiece> pieces;
  for (size_t i = 0; i < asks.size(); ++i) {
    pieces.push_back(ChunkPiece{asks[i].chunk, asks[i].offset, asks[i].length, slots.dest(i)});
  }
  *status = source.ReadPieces(f.dataset, 0, pieces, options);
  Outcome out;
  out.hit.assign(asks.size(), status->ok());
  for (size_t i = 0; i < asks.size() && status->ok(); ++i) {
    const Ask& a = asks[i];
    const ChunkPtr want = f.Expected(a.chunk);
    if (std::memcmp(slots.dest(i), want->bytes.data() + a.offset, a.length) != 0) out.wrong += Describe(a) + "\n";
  }
  out.guard_damage = slots.GuardDamage();
  return out;
}

uint64_t SumLengths(const std::vector<Ask>& asks) {
  uint64_t n = 0;
  for (const Ask& a : asks) n += a.length;
  return n;
}

// Pieces of every chunk of the pieces dataset, shuffled, several per chunk.
std::vector<Ask> DatasetAsks(const CacheFixture& f, const std::vector<uint64_t>& chunks, size_t per_chunk,
                             std::mt19937_64& rng) {
  std::vector<Ask> asks;
  for (uint64_t c : chunks) {
    const uint64_t len = f.Length(c);
    asks.push_back(Ask{c, len - 10, 10, 1});  // the tail
    for (const Ask& a : RandomAsks(c, len, per_chunk - 1, rng)) asks.push_back(a);
  }
  std::shuffle(asks.begin(), asks.end(), rng);
  return asks;
}

}  // namespace

// =============================================================================================
// NvmeStore::ReadPieces

TEST_CASE("nvme pieces: every shape of piece reads back byte-exact, and only its own bytes are written",
          "[cache][nvme][pieces]") {
  TempDir dir;
  auto o = StoreOptions(dir / "cache");
  o.use_io_uring = GENERATE(true, false);  // io_uring batch, or pread where refused or off
  auto store = OpenStore(o);
  INFO("io_uring requested " << o.use_io_uring << ", in use " << store->Stats().io_uring);
  // An odd chunk (short last block), one of exactly 4 MiB (whole-chunk reads can land straight
  // in an aligned destination) and one smaller than a block.
  const auto chunks = StoreChunks(*store, {kOddChunkBytes, 4ull << 20, 5000});
  std::mt19937_64 rng(20261202);

  std::vector<Ask> asks;
  for (size_t c = 0; c < chunks.size(); ++c) {
    const uint64_t len = chunks[c].chunk->bytes.size();
    if (len >= 4 * kBlock) {
      for (const Ask& a : EdgeAsks(c, len)) asks.push_back(a);
      asks.push_back(Ask{c, len - kBlock, kBlock, 0});  // the last 64 KiB, aligned
    } else {
      asks.push_back(Ask{c, 0, len, 0});
      asks.push_back(Ask{c, 0, len, 1});
      asks.push_back(Ask{c, 4000, 1000, 0});
      asks.push_back(Ask{c, len - 1, 1, 0});
    }
  }
  for (const Ask& a : RandomAsks(0, kOddChunkBytes, 120, rng)) asks.push_back(a);
  for (const Ask& a : RandomAsks(1, 4ull << 20, 40, rng)) asks.push_back(a);
  std::shuffle(asks.begin(), asks.end(), rng);

  const auto before = store->Stats();
  const Outcome out = ReadNvme(*store, chunks, asks);
  CHECK(out.Misses(asks) == "");
  CHECK(out.wrong == "");
  CHECK(out.guard_damage == 0);
  const auto after = store->Stats();
  CHECK(after.hits - before.hits == asks.size());
  CHECK(after.misses == before.misses);
  CHECK(after.checksum_failures == 0);

  // One piece per call gives the same bytes.
  for (size_t i = 0; i < asks.size(); i += 7) {
    const Outcome one = ReadNvme(*store, chunks, {asks[i]});
    INFO(Describe(asks[i]));
    CHECK(one.hit[0]);
    CHECK(one.wrong == "");
    CHECK(one.guard_damage == 0);
  }
}

TEST_CASE("nvme pieces: empty pieces hit, pieces outside the chunk or of absent chunks miss, nothing crashes",
          "[cache][nvme][pieces]") {
  TempDir dir;
  auto store = OpenStore(StoreOptions(dir / "cache"));
  const auto chunks = StoreChunks(*store, {kOddChunkBytes, 4ull << 20, 5000});

  SECTION("zero-length pieces hit and write nothing") {
    const std::vector<Ask> empty = {{0, 0, 0, 0}, {0, kOddChunkBytes, 0, 1}, {2, 123, 0, 0}};
    const Outcome e = ReadNvme(*store, chunks, empty);
    CHECK(e.hits() == 3);
    CHECK(e.guard_damage == 0);
  }

  SECTION("pieces outside their chunk miss without touching the entry or the destination") {
    const uint64_t len = kOddChunkBytes;
    const std::vector<Ask> bad = {
        {0, len, 1, 0},                 // starts at the end
        {0, len - 10, 11, 0},           // runs one byte past the end
        {0, 0, len + 1, 0},             // one byte longer than the chunk
        {0, len + kBlock, kBlock, 0},   // a whole block past the end
        {0, UINT64_MAX - 5, 10, 0},     // offset + length wraps around
        {0, 10, UINT64_MAX - 5, 0},     // so does this one
    };
    // Destinations for the absurd lengths are never written; give them a token size.
    std::vector<Ask> sized = bad;
    for (Ask& a : sized) a.length = std::min<uint64_t>(a.length, 2 * len);
    Slots slots(sized);
    std::vector<NvmePiece> pieces;
    for (size_t i = 0; i < bad.size(); ++i) {
      pieces.push_back(MakeNvmePiece(chunks[0], bad[i].offset, bad[i].length, slots.dest(i)));
    }
    const auto st0 = store->Stats();
    const std::vector<bool> hit = store->ReadPieces(pieces);
    for (size_t i = 0; i < bad.size(); ++i) {
      INFO(Describe(bad[i]));
      CHECK_FALSE(hit[i]);
    }
    // Nothing written anywhere: compare every destination with the guard byte.
    for (size_t i = 0; i < sized.size(); ++i) {
      const uint8_t* d = slots.dest(i);
      CHECK(std::all_of(d, d + sized[i].length, [](uint8_t b) { return b == kGuard; }));
    }
    CHECK(slots.GuardDamage() == 0);
    const auto st1 = store->Stats();
    CHECK(st1.misses - st0.misses == bad.size());
    CHECK(st1.checksum_failures == 0);
    CHECK(store->Contains(chunks[0].key));  // a caller's bad piece does not drop a good entry
    CHECK(ReadNvme(*store, chunks, {{0, 0, kOddChunkBytes, 0}}).hit[0]);
  }

  SECTION("a chunk that is not stored misses") {
    Stored absent{MakeChunkKey("pieces-v1", 0, 99), PatternChunk(kOddChunkBytes, 99)};
    std::vector<Stored> with_absent = chunks;
    with_absent.push_back(absent);
    const Outcome m = ReadNvme(*store, with_absent, {{3, 0, 100, 0}, {3, 0, kOddChunkBytes, 0}, {0, 5, 5, 0}});
    CHECK_FALSE(m.hit[0]);
    CHECK_FALSE(m.hit[1]);
    CHECK(m.hit[2]);
    CHECK(m.wrong == "");
  }
}

TEST_CASE("nvme pieces: concurrent readers of the same chunks all get exact bytes", "[cache][nvme][pieces]") {
  TempDir dir;
  auto store = OpenStore(StoreOptions(dir / "cache"));
  const auto chunks = StoreChunks(*store, {kOddChunkBytes, kOddChunkBytes});
  std::atomic<int> bad{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(1000 + t);
      for (int round = 0; round < 5; ++round) {
        std::vector<Ask> asks = RandomAsks(0, kOddChunkBytes, 20, rng);
        for (const Ask& a : RandomAsks(1, kOddChunkBytes, 20, rng)) asks.push_back(a);
        const Outcome out = ReadNvme(*store, chunks, asks);
        if (out.hits() != asks.size() || !out.wrong.empty() || out.guard_damage != 0) ++bad;
      }
    });
  }
  for (auto& t : threads) t.join();
  CHECK(bad.load() == 0);
  CHECK(store->Stats().checksum_failures == 0);
}

TEST_CASE("nvme pieces: a corrupt data block is caught by the piece that covers it and drops the entry",
          "[cache][nvme][pieces][faults]") {
  TempDir dir;
  const auto o = StoreOptions(dir / "cache");
  auto store = OpenStore(o);
  const auto chunks = StoreChunks(*store, {kOddChunkBytes, kOddChunkBytes, kOddChunkBytes, kOddChunkBytes});
  const uint64_t len = kOddChunkBytes;

  SECTION("direct partial read (aligned destination, whole blocks)") {
    CorruptData(o.dir, store->index_db(), chunks[0].key, 5 * kBlock + 777);
    // Partial reads verify only the blocks they cover: block 2 of the same chunk still reads.
    Outcome out = ReadNvme(*store, chunks, {{0, 2 * kBlock, kBlock, 0}, {1, 5 * kBlock, kBlock, 0}});
    CHECK(out.hits() == 2);
    CHECK(out.wrong == "");
    CHECK(store->Stats().checksum_failures == 0);
    // Block 5 of chunk 0 misses; the same piece of another chunk, in the same call, hits.
    out = ReadNvme(*store, chunks, {{0, 5 * kBlock, kBlock, 0}, {1, 5 * kBlock, kBlock, 0}});
    CHECK_FALSE(out.hit[0]);
    CHECK(out.hit[1]);
    CHECK(out.wrong == "");
    CHECK(out.guard_damage == 0);
    CHECK(store->Stats().checksum_failures == 1);
    CHECK_FALSE(store->Contains(chunks[0].key));
    CHECK(store->Contains(chunks[1].key));
    // Dropped: even the good block of the chunk misses now, and nothing is counted twice.
    out = ReadNvme(*store, chunks, {{0, 2 * kBlock, kBlock, 0}});
    CHECK_FALSE(out.hit[0]);
    CHECK(store->Stats().checksum_failures == 1);
  }

  SECTION("bounce read (unaligned destination) of a few bytes inside the corrupt block") {
    CorruptData(o.dir, store->index_db(), chunks[1].key, 9 * kBlock + 4000);
    Outcome out = ReadNvme(*store, chunks, {{1, 9 * kBlock + 10, 100, 3}, {2, 9 * kBlock + 10, 100, 3}});
    CHECK_FALSE(out.hit[0]);
    CHECK(out.hit[1]);
    CHECK(out.wrong == "");
    CHECK(out.guard_damage == 0);
    CHECK(store->Stats().checksum_failures == 1);
    CHECK_FALSE(store->Contains(chunks[1].key));
  }

  SECTION("a piece spanning into the corrupt block misses") {
    CorruptData(o.dir, store->index_db(), chunks[2].key, 11 * kBlock);  // first byte of block 11
    const Outcome out = ReadNvme(*store, chunks, {{2, 11 * kBlock - 50, 51, 0}});
    CHECK_FALSE(out.hit[0]);
    CHECK(store->Stats().checksum_failures == 1);
    CHECK_FALSE(store->Contains(chunks[2].key));
  }

  SECTION("the short last block is verified over its real length") {
    CorruptData(o.dir, store->index_db(), chunks[3].key, len - 1);  // last byte of the chunk
    Outcome out = ReadNvme(*store, chunks, {{3, 63 * kBlock, kBlock, 0}});  // block 63: clean
    CHECK(out.hit[0]);
    CHECK(out.wrong == "");
    out = ReadNvme(*store, chunks, {{3, len - 1, 1, 0}});
    CHECK_FALSE(out.hit[0]);
    CHECK(store->Stats().checksum_failures == 1);
    CHECK_FALSE(store->Contains(chunks[3].key));
  }

  SECTION("whole-chunk reads of a corrupt chunk miss, aligned or not") {
    CorruptData(o.dir, store->index_db(), chunks[0].key, 40 * kBlock + 1);
    CorruptData(o.dir, store->index_db(), chunks[1].key, 3);
    const Outcome out = ReadNvme(*store, chunks, {{0, 0, len, 0}, {1, 0, len, 1}, {2, 0, len, 0}});
    CHECK_FALSE(out.hit[0]);
    CHECK_FALSE(out.hit[1]);
    CHECK(out.hit[2]);
    CHECK(out.wrong == "");
    CHECK(out.guard_damage == 0);
    CHECK(store->Stats().checksum_failures == 2);
    CHECK_FALSE(store->Contains(chunks[0].key));
    CHECK_FALSE(store->Contains(chunks[1].key));
  }

  SECTION("any piece of a chunk of one block (no table) is checked against the whole chunk") {
    TempDir dir2;
    const auto o2 = StoreOptions(dir2 / "cache");
    auto store2 = OpenStore(o2);
    const auto small = StoreChunks(*store2, {5000, kBlock, 5000});
    CorruptData(o2.dir, store2->index_db(), small[0].key, 4000);
    CorruptData(o2.dir, store2->index_db(), small[1].key, kBlock - 1);
    // Neither piece covers the corrupt byte; both chunks are still caught.
    const Outcome out =
        ReadNvme(*store2, small, {{0, 0, 100, 0}, {1, 0, 4096, 0}, {2, 0, 100, 0}, {2, 4096, 904, 1}});
    CHECK_FALSE(out.hit[0]);
    CHECK_FALSE(out.hit[1]);
    CHECK(out.hit[2]);
    CHECK(out.hit[3]);
    CHECK(out.wrong == "");
    CHECK(out.guard_damage == 0);
    CHECK(store2->Stats().checksum_failures == 2);
    CHECK_FALSE(store2->Contains(small[0].key));
    CHECK_FALSE(store2->Contains(small[1].key));
  }

  SECTION("whole-chunk reads land in an aligned destination directly and are still verified") {
    // A 4 MiB chunk (no padding) read whole into an aligned slot is the direct whole-chunk path.
    TempDir dir2;
    const auto o2 = StoreOptions(dir2 / "cache");
    auto store2 = OpenStore(o2);
    const auto exact = StoreChunks(*store2, {4ull << 20, 4ull << 20});
    CorruptData(o2.dir, store2->index_db(), exact[0].key, (4ull << 20) - 1);
    const Outcome out = ReadNvme(*store2, exact, {{0, 0, 4ull << 20, 0}, {1, 0, 4ull << 20, 0}});
    CHECK_FALSE(out.hit[0]);
    CHECK(out.hit[1]);
    CHECK(out.wrong == "");
    CHECK(store2->Stats().checksum_failures == 1);
    CHECK_FALSE(store2->Contains(exact[0].key));
  }
}

TEST_CASE("nvme pieces: a corrupt block table fails the partial reads of its block only",
          "[cache][nvme][pieces][faults]") {
  TempDir dir;
  const auto o = StoreOptions(dir / "cache");
  auto store = OpenStore(o);
  const auto chunks = StoreChunks(*store, {kOddChunkBytes, kOddChunkBytes});
  const uint64_t len = kOddChunkBytes;

  SECTION("an inner block's checksum") {
    CorruptTable(o.dir, store->index_db(), chunks[0].key, len, 7);
    // Whole-chunk reads are verified against the manifest hash and do not read the table.
    Outcome out = ReadNvme(*store, chunks, {{0, 0, len, 0}, {0, kBlock, 100, 1}, {0, 8 * kBlock, kBlock, 0}});
    CHECK(out.hits() == 3);
    CHECK(out.wrong == "");
    CHECK(store->Stats().checksum_failures == 0);
    out = ReadNvme(*store, chunks, {{0, 7 * kBlock + 100, 50, 0}, {1, 7 * kBlock + 100, 50, 0}});
    CHECK_FALSE(out.hit[0]);
    CHECK(out.hit[1]);
    CHECK(out.wrong == "");
    CHECK(store->Stats().checksum_failures == 1);
    CHECK_FALSE(store->Contains(chunks[0].key));
  }

  SECTION("the table of a chunk of two blocks") {
    TempDir dir2;
    const auto o2 = StoreOptions(dir2 / "cache");
    auto store2 = OpenStore(o2);
    const auto two = StoreChunks(*store2, {kBlock + 1});
    CorruptTable(o2.dir, store2->index_db(), two[0].key, kBlock + 1, 1);
    Outcome out = ReadNvme(*store2, two, {{0, 0, kBlock, 0}, {0, 0, kBlock + 1, 0}});
    CHECK(out.hits() == 2);
    CHECK(out.wrong == "");
    out = ReadNvme(*store2, two, {{0, kBlock, 1, 0}});
    CHECK_FALSE(out.hit[0]);
    CHECK(store2->Stats().checksum_failures == 1);
  }

  SECTION("the short last block's checksum") {
    CorruptTable(o.dir, store->index_db(), chunks[1].key, len, 64);
    Outcome out = ReadNvme(*store, chunks, {{1, 63 * kBlock, kBlock, 0}});
    CHECK(out.hit[0]);
    out = ReadNvme(*store, chunks, {{1, len - 1234, 1234, 0}});
    CHECK_FALSE(out.hit[0]);
    CHECK(store->Stats().checksum_failures == 1);
    CHECK_FALSE(store->Contains(chunks[1].key));
  }
}

TEST_CASE("nvme pieces: a stored length that differs from the manifest's is a miss and drops the entry",
          "[cache][nvme][pieces][faults]") {
  TempDir dir;
  auto store = OpenStore(StoreOptions(dir / "cache"));
  const auto chunks = StoreChunks(*store, {5000, kOddChunkBytes});
  Slots slots({{0, 0, 100, 0}, {1, 0, 100, 0}});
  // The manifest claims one byte less for chunk 0 (the piece itself lies inside both lengths).
  std::vector<NvmePiece> pieces = {
      NvmePiece{chunks[0].key, 4999, chunks[0].chunk->hash, 0, 100, slots.dest(0)},
      MakeNvmePiece(chunks[1], 0, 100, slots.dest(1)),
  };
  const auto hit = store->ReadPieces(pieces);
  CHECK_FALSE(hit[0]);
  CHECK(hit[1]);
  CHECK(std::memcmp(slots.dest(1), chunks[1].chunk->bytes.data(), 100) == 0);
  CHECK(store->Stats().checksum_failures == 1);
  CHECK_FALSE(store->Contains(chunks[0].key));
  CHECK(slots.GuardDamage() == 0);
}

TEST_CASE("nvme pieces: extents hold data and table padded to 4 KiB, and pieces survive a restart",
          "[cache][nvme][pieces][restart]") {
  // Data padded to 4 KiB, then one xxh3-64 per 64 KiB block padded to 4 KiB; a chunk of one
  // block has no table (its pieces are read whole and checked against the manifest hash).
  CHECK(ExtentBytes(1) == 4096);
  CHECK(ExtentBytes(4096) == 4096);
  CHECK(ExtentBytes(4097) == 8192);
  CHECK(ExtentBytes(kBlock) == kBlock);
  CHECK(ExtentBytes(kBlock + 1) == kBlock + 4096 + 4096);
  CHECK(ExtentBytes(4ull << 20) == (4ull << 20) + 4096);
  CHECK(ExtentBytes(kOddChunkBytes) == (4ull << 20) + 4096 + 4096);
  CHECK(ExtentBytes(32ull << 20) == (32ull << 20) + 4096);             // 512 blocks: one page
  CHECK(ExtentBytes((32ull << 20) + 1) == (32ull << 20) + 4096 + 8192);  // 513 blocks: two

  TempDir dir;
  const auto o = StoreOptions(dir / "cache");
  const uint64_t extent = ExtentBytes(kOddChunkBytes);
  const uint64_t per_segment = o.segment_bytes / extent;
  REQUIRE(per_segment == 3);
  std::vector<Stored> chunks;
  {
    auto store = OpenStore(o);
    chunks = StoreChunks(*store, std::vector<uint64_t>(7, kOddChunkBytes));
    const auto st = store->Stats();
    CHECK(st.entries == 7);
    CHECK(st.segments == 3);  // 3 + 3 + 1
    std::map<uint32_t, std::vector<uint64_t>> offsets;
    auto note = [&](const EntryLocation& loc, const EntryRecord&) { offsets[loc.segment].push_back(loc.offset); };
    REQUIRE(store->index_db().ForEachEntry(note, [](const EntryLocation&) {}).ok());
    std::vector<size_t> counts;
    for (auto& [id, offs] : offsets) {
      counts.push_back(offs.size());
      std::sort(offs.begin(), offs.end());
      for (size_t k = 0; k < offs.size(); ++k) CHECK(offs[k] == k * extent);  // back to back
    }
    CHECK(counts == std::vector<size_t>{3, 3, 1});
  }
  // Reopen: the tables come back with the index.
  auto store = OpenStore(o);
  CHECK(store->recovery().entries == 7);
  CHECK(store->recovery().dropped_entries == 0);
  std::mt19937_64 rng(7);
  std::vector<Ask> asks;
  for (size_t c = 0; c < chunks.size(); ++c) {
    for (const Ask& a : EdgeAsks(c, kOddChunkBytes)) asks.push_back(a);
    for (const Ask& a : RandomAsks(c, kOddChunkBytes, 10, rng)) asks.push_back(a);
  }
  const Outcome out = ReadNvme(*store, chunks, asks);
  CHECK(out.Misses(asks) == "");
  CHECK(out.wrong == "");
  CHECK(out.guard_damage == 0);
  CHECK(store->Stats().checksum_failures == 0);
  // And a table written before the restart still catches corruption after it.
  CorruptData(o.dir, store->index_db(), chunks[4].key, 20 * kBlock + 5);
  const Outcome bad = ReadNvme(*store, chunks, {{4, 20 * kBlock, 10, 0}, {4, 30 * kBlock, 10, 0}});
  CHECK_FALSE(bad.hit[0]);
  CHECK(store->Stats().checksum_failures == 1);
}

TEST_CASE("nvme pieces: chunks with and without a block table, written back to back, read exact before and "
          "after a restart",
          "[cache][nvme][pieces][restart]") {
  TempDir dir;
  const auto o = StoreOptions(dir / "cache");
  const std::vector<uint64_t> lengths = {5000,   kBlock, kBlock + 1, 200000,         1,      4096,
                                         131072, 70000,  kBlock - 1, kOddChunkBytes, 300001, 8192};
  std::vector<Stored> chunks;
  std::mt19937_64 rng(31);
  auto asks_for = [&] {
    std::vector<Ask> asks;
    for (size_t c = 0; c < lengths.size(); ++c) {
      const uint64_t len = lengths[c];
      asks.push_back({c, 0, len, 0});
      asks.push_back({c, 0, len, 1});
      asks.push_back({c, len - 1, 1, 0});
      asks.push_back({c, 0, std::min<uint64_t>(len, 4096), 0});
      asks.push_back({c, len / 2, len - len / 2, 5});
      if (len > kBlock) asks.push_back({c, kBlock, std::min<uint64_t>(kBlock, len - kBlock), 0});
      for (const Ask& a : RandomAsks(c, len, 5, rng)) asks.push_back(a);
    }
    std::shuffle(asks.begin(), asks.end(), rng);
    return asks;
  };
  {
    auto store = OpenStore(o);
    chunks = StoreChunks(*store, lengths);
    // Extents follow each other exactly as ExtentBytes says.
    std::map<std::pair<uint32_t, uint64_t>, uint64_t> length_at;  // (segment, offset) → length
    auto note = [&](const EntryLocation& loc, const EntryRecord& e) { length_at[{loc.segment, loc.offset}] = e.length; };
    REQUIRE(store->index_db().ForEachEntry(note, [](const EntryLocation&) {}).ok());
    REQUIRE(length_at.size() == lengths.size());
    for (auto it = length_at.begin(); std::next(it) != length_at.end(); ++it) {
      auto next = std::next(it);
      if (next->first.first != it->first.first) continue;
      INFO("segment " << it->first.first << " offset " << it->first.second << " length " << it->second);
      CHECK(next->first.second == it->first.second + ExtentBytes(it->second));
    }
    const std::vector<Ask> asks = asks_for();
    const Outcome out = ReadNvme(*store, chunks, asks);
    CHECK(out.Misses(asks) == "");
    CHECK(out.wrong == "");
    CHECK(out.guard_damage == 0);
  }
  auto store = OpenStore(o);
  CHECK(store->recovery().entries == lengths.size());
  CHECK(store->recovery().dropped_entries == 0);
  const std::vector<Ask> asks = asks_for();
  const Outcome out = ReadNvme(*store, chunks, asks);
  CHECK(out.Misses(asks) == "");
  CHECK(out.wrong == "");
  CHECK(out.guard_damage == 0);
  CHECK(store->Stats().checksum_failures == 0);
}

// =============================================================================================
// CachedSource::ReadPieces

TEST_CASE("cached pieces: 8 readers of pieces of one cold chunk cause one upstream fetch, then NVMe serves them",
          "[cache][source][pieces][single_flight]") {
  TempDir dir;
  CacheFixture f(SmallCacheOptions(dir / "cache"));
  const uint64_t chunk = 3;
  const uint64_t len = f.Length(chunk);
  // Thread t asks for two pieces of chunk 3 of its own.
  auto asks_of = [&](int t) {
    return std::vector<Ask>{{chunk, t * 100000ull + t, 50000ull + t, static_cast<uint64_t>(t % 2)},
                            {chunk, len - 1000ull * (t + 1), 1000, static_cast<uint64_t>(t)}};
  };
  f.upstream->delay_ms = 200;  // keep the flight open while the others arrive
  std::atomic<int> bad{0};
  std::vector<std::thread> readers;
  for (int t = 0; t < 8; ++t) {
    readers.emplace_back([&, t] {
      Status s;
      const Outcome out = ReadSource(*f.cache, f, asks_of(t), &s);
      if (!s.ok() || !out.wrong.empty() || out.guard_damage != 0) ++bad;
    });
  }
  for (auto& t : readers) t.join();
  CHECK(bad.load() == 0);
  CHECK(f.upstream->FetchCount(0, chunk) == 1);
  CHECK(f.upstream->calls.load() == 1);
  CHECK(f.cache->Stats().upstream_fetched_chunks == 1);

  f.cache->Flush();
  f.upstream->delay_ms = 0;
  const auto before = f.cache->Stats();
  std::vector<Ask> all;
  for (int t = 0; t < 8; ++t) {
    for (const Ask& a : asks_of(t)) all.push_back(a);
  }
  Status s;
  const Outcome out = ReadSource(*f.cache, f, all, &s);
  REQUIRE(s.ok());
  CHECK(out.wrong == "");
  CHECK(out.guard_damage == 0);
  const auto after = f.cache->Stats();
  CHECK(f.upstream->calls.load() == 1);
  CHECK(after.hits_nvme - before.hits_nvme == all.size());
  CHECK(after.nvme.hits - before.nvme.hits == all.size());
  // Sub-chunk reads: only the bytes asked for are served from NVMe, not whole chunks.
  CHECK(after.served_nvme_bytes - before.served_nvme_bytes == SumLengths(all));
  CHECK(after.upstream_fetched_chunks == 1);
  CHECK(after.nvme.checksum_failures == 0);
}

TEST_CASE("cached pieces: pieces across a run of cold chunks are fetched as one range and then served from NVMe",
          "[cache][source][pieces]") {
  TempDir dir;
  CacheFixture f(SmallCacheOptions(dir / "cache"));
  std::mt19937_64 rng(3);
  const std::vector<Ask> asks = DatasetAsks(f, {0, 1, 2, 3, 4, 5, 6, 7}, 6, rng);
  Status s;
  Outcome out = ReadSource(*f.cache, f, asks, &s);
  REQUIRE(s.ok());
  CHECK(out.wrong == "");
  CHECK(out.guard_damage == 0);
  CHECK(f.upstream->calls.load() == 1);
  for (uint64_t c = 0; c < 8; ++c) CHECK(f.upstream->FetchCount(0, c) == 1);

  f.cache->Flush();
  const auto before = f.cache->Stats();
  CHECK(before.nvme.entries == 8);
  out = ReadSource(*f.cache, f, asks, &s);
  REQUIRE(s.ok());
  CHECK(out.wrong == "");
  CHECK(out.guard_damage == 0);
  const auto after = f.cache->Stats();
  CHECK(f.upstream->calls.load() == 1);
  CHECK(after.hits_nvme - before.hits_nvme == asks.size());
  CHECK(after.served_nvme_bytes - before.served_nvme_bytes == SumLengths(asks));
  CHECK(after.served_upstream_bytes == before.served_upstream_bytes);
}

TEST_CASE("cached pieces: the DRAM tier answers pieces, and NVMe hits are not copied into DRAM",
          "[cache][source][pieces][dram]") {
  TempDir dir;
  auto o = SmallCacheOptions(dir / "cache");
  o.memory_bytes = 64ull << 20;
  CacheFixture f(o);
  std::mt19937_64 rng(5);
  const std::vector<Ask> asks = DatasetAsks(f, {1, 2, 6}, 5, rng);
  Status s;
  Outcome out = ReadSource(*f.cache, f, asks, &s);
  REQUIRE(s.ok());
  CHECK(out.wrong == "");
  f.cache->Flush();
  auto before = f.cache->Stats();
  CHECK(before.dram_used_bytes > 0);
  out = ReadSource(*f.cache, f, asks, &s);
  REQUIRE(s.ok());
  CHECK(out.wrong == "");
  CHECK(out.guard_damage == 0);
  auto after = f.cache->Stats();
  CHECK(after.hits_dram - before.hits_dram == asks.size());
  CHECK(after.served_dram_bytes - before.served_dram_bytes == SumLengths(asks));
  CHECK(after.hits_nvme == before.hits_nvme);
  CHECK(after.nvme.hits == before.nvme.hits);
  CHECK(f.upstream->calls.load() == 2);  // runs [1, 3) and [6, 7), once

  // A restarted node: DRAM is empty, NVMe answers, and DRAM stays empty.
  f.Open(o);
  out = ReadSource(*f.cache, f, asks, &s);
  REQUIRE(s.ok());
  CHECK(out.wrong == "");
  after = f.cache->Stats();
  CHECK(after.hits_nvme == asks.size());
  CHECK(after.dram_entries == 0);
  CHECK(f.upstream->calls.load() == 0);
}

TEST_CASE("cached pieces: a corrupt NVMe chunk is refetched from upstream and the piece is still exact",
          "[cache][source][pieces][faults]") {
  TempDir dir;
  const auto o = SmallCacheOptions(dir / "cache");
  CacheFixture f(o);
  Status s;
  std::mt19937_64 rng(11);
  const std::vector<Ask> warm = DatasetAsks(f, {0, 1, 2, 3}, 2, rng);
  REQUIRE(ReadSource(*f.cache, f, warm, &s).wrong == "");
  REQUIRE(s.ok());
  f.cache->Flush();
  f.cache.reset();
  {
    auto db = IndexDb::Open(o.dir + "/index", 1 << 20);
    REQUIRE(db.ok());
    CorruptData(o.dir, **db, MakeChunkKey(f.dataset->version, 0, 2), 3 * kBlock + 99);
  }
  f.Open(o);
  // Block 3 of chunk 2 (corrupt) in a direct-path slot; chunk 1 untouched.
  const std::vector<Ask> asks = {{2, 3 * kBlock, kBlock, 0}, {1, 3 * kBlock, kBlock, 0}};
  Outcome out = ReadSource(*f.cache, f, asks, &s);
  REQUIRE(s.ok());
  CHECK(out.wrong == "");
  CHECK(out.guard_damage == 0);
  CHECK(f.upstream->FetchCount(0, 2) == 1);
  CHECK(f.upstream->FetchCount(0, 1) == 0);
  CHECK(f.upstream->chunks_sent.load() == 1);
  auto st = f.cache->Stats();
  CHECK(st.nvme.checksum_failures == 1);
  CHECK(st.hits_nvme == 1);  // chunk 1's piece
  // The refetched chunk is stored again and then read from NVMe without another failure.
  f.cache->Flush();
  const std::vector<Ask> again = {{2, 3 * kBlock, kBlock, 0}, {2, 3 * kBlock + 50, 100, 1}, {2, 0, f.Length(2), 0}};
  out = ReadSource(*f.cache, f, again, &s);
  REQUIRE(s.ok());
  CHECK(out.wrong == "");
  st = f.cache->Stats();
  CHECK(st.nvme.checksum_failures == 1);
  CHECK(f.upstream->chunks_sent.load() == 1);
  CHECK(st.hits_nvme == 1 + again.size());
}

TEST_CASE("cached pieces: a piece outside its chunk is InvalidArgument naming the chunk, before any fetch",
          "[cache][source][pieces]") {
  TempDir dir;
  CacheFixture f(SmallCacheOptions(dir / "cache"));
  uint8_t buf[64];
  const uint64_t len = f.Length(3);
  std::vector<ChunkPiece> pieces = {{1, 0, 10, buf}, {3, len - 5, 10, buf + 10}};
  Status s = f.cache->ReadPieces(f.dataset, 0, pieces, ReadOptions());
  CHECK(s.code() == StatusCode::kInvalidArgument);
  CHECK_THAT(s.message(), Catch::Contains("chunk 3"));
  pieces = {{8, 0, 10, buf}};  // the shard has chunks 0..7
  s = f.cache->ReadPieces(f.dataset, 0, pieces, ReadOptions());
  CHECK(s.code() == StatusCode::kInvalidArgument);
  CHECK(f.upstream->calls.load() == 0);
}

TEST_CASE("cached pieces: without an NVMe tier pieces come from upstream, exact", "[cache][source][pieces]") {
  CacheOptions o;
  o.size_bytes = 0;
  o.memory_bytes = 0;
  CacheFixture f(o);
  std::mt19937_64 rng(13);
  const std::vector<Ask> asks = DatasetAsks(f, {2, 3, 5}, 4, rng);
  Status s;
  const Outcome out = ReadSource(*f.cache, f, asks, &s);
  REQUIRE(s.ok());
  CHECK(out.wrong == "");
  CHECK(out.guard_damage == 0);
  CHECK(f.upstream->calls.load() == 2);  // runs [2, 4) and [5, 6)
}

// =============================================================================================
// Runs (chunk_run.h): pieces kept without their chunk

TEST_CASE("runs: a run reads back intact; a flipped byte, another identity or another length fails its trailer",
          "[cache][runs]") {
  const ChunkKey chunk = MakeChunkKey("v1", 2, 7);
  std::vector<uint8_t> bytes(5000);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<uint8_t>(i * 31 + 7);
  const RunId id{chunk, 12345, bytes.size()};
  const std::shared_ptr<Chunk> run = NewRun(id);
  std::memcpy(run->bytes.data(), bytes.data(), bytes.size());
  SealRun(id, *run);
  REQUIRE(run->bytes.size() == RunStoredBytes(id));
  CHECK(std::memcmp(run->bytes.data(), bytes.data(), bytes.size()) == 0);
  CHECK(RunIntact(id, run->bytes.data(), run->bytes.size()));
  CHECK(IsRunKey(RunKey(id)));
  CHECK(!IsRunKey(chunk));
  CHECK(RunKey(id).version == chunk.version);
  CHECK(RunKey(id).shard == chunk.shard);
  // Each part of the identity changes the key and fails the trailer.
  for (RunId other : {RunId{chunk, 12346, bytes.size()}, RunId{MakeChunkKey("v1", 2, 8), 12345, bytes.size()},
                      RunId{MakeChunkKey("v2", 2, 7), 12345, bytes.size()}}) {
    CHECK(!(RunKey(other) == RunKey(id)));
    CHECK(!RunIntact(other, run->bytes.data(), run->bytes.size()));
  }
  CHECK(!RunIntact(RunId{chunk, 12345, bytes.size() - 1}, run->bytes.data(), run->bytes.size() - 1));
  for (uint64_t at : {uint64_t{0}, uint64_t{2500}, bytes.size() - 1, bytes.size(), RunStoredBytes(id) - 1}) {
    AlignedBuffer flipped(run->bytes.size());
    std::memcpy(flipped.data(), run->bytes.data(), run->bytes.size());
    flipped.data()[at] ^= 0x10;
    INFO("flipped byte " << at);
    CHECK(!RunIntact(id, flipped.data(), flipped.size()));
  }
}

namespace {

ReadOptions PiecesOnly() {
  ReadOptions ro;
  ro.whole_chunks = false;
  return ro;
}

}  // namespace

TEST_CASE("cached runs: pieces-only reads keep their pieces; DRAM, then NVMe after a restart, serve them exact "
          "with the upstream down",
          "[cache][source][pieces][runs]") {
  TempDir dir;
  auto o = SmallCacheOptions(dir / "cache");
  o.memory_bytes = 64ull << 20;
  CacheFixture f(o);
  std::mt19937_64 rng(17);
  const std::vector<Ask> asks = DatasetAsks(f, {0, 2, 3, 7}, 5, rng);
  Status s;
  Outcome out = ReadSource(*f.cache, f, asks, &s, PiecesOnly());
  REQUIRE(s.ok());
  CHECK(out.wrong == "");
  CHECK(out.guard_damage == 0);
  auto st = f.cache->Stats();
  CHECK(st.runs_kept == asks.size());
  CHECK(st.run_hits == 0);
  CHECK(st.served_upstream_bytes == SumLengths(asks));
  CHECK(st.upstream_fetched_chunks == 0);  // no chunk was kept whole
  f.cache->Flush();
  CHECK(f.cache->Stats().nvme.entries == asks.size());

  // The upstream is down: DRAM answers every piece, pieces-only or not.
  f.upstream->fail = true;
  for (const ReadOptions& ro : {PiecesOnly(), ReadOptions()}) {
    const auto before = f.cache->Stats();
    out = ReadSource(*f.cache, f, asks, &s, ro);
    REQUIRE(s.ok());
    CHECK(out.wrong == "");
    CHECK(out.guard_damage == 0);
    const auto after = f.cache->Stats();
    CHECK(after.run_hits - before.run_hits == asks.size());
    CHECK(after.hits_dram - before.hits_dram == asks.size());
    CHECK(after.served_dram_bytes - before.served_dram_bytes == SumLengths(asks));
  }

  // A restarted node: the runs come back from NVMe, verified, with the upstream still down.
  f.Open(o);
  f.upstream->fail = true;
  out = ReadSource(*f.cache, f, asks, &s, PiecesOnly());
  REQUIRE(s.ok());
  CHECK(out.wrong == "");
  CHECK(out.guard_damage == 0);
  st = f.cache->Stats();
  CHECK(st.hits_nvme == asks.size());
  CHECK(st.run_hits == asks.size());
  CHECK(st.served_nvme_bytes == SumLengths(asks));
  CHECK(st.nvme.checksum_failures == 0);
  CHECK(f.upstream->calls.load() == 0);
  // Runs answer exactly the pieces they were: a piece inside one is a miss (the upstream's
  // error here), nothing made up.
  const Ask inside{asks[0].chunk, asks[0].offset + 1, asks[0].length - 1, 0};
  REQUIRE(asks[0].length > 1);
  ReadSource(*f.cache, f, {inside}, &s, PiecesOnly());
  CHECK(s.code() == StatusCode::kUnavailable);
}

TEST_CASE("cached runs: a keep-only read lands its pieces in runs with no destination, skips what the tiers "
          "hold, and the runs then serve exact with the upstream down",
          "[cache][source][pieces][runs]") {
  TempDir dir;
  auto o = SmallCacheOptions(dir / "cache");
  o.memory_bytes = 64ull << 20;
  CacheFixture f(o);
  std::mt19937_64 rng(23);
  const std::vector<Ask> asks = DatasetAsks(f, {0, 2, 3, 7}, 5, rng);
  // A third of them read first the usual way: the keep-only read must not fetch them again.
  const std::vector<Ask> first(asks.begin(), asks.begin() + asks.size() / 3);
  Status s;
  ReadSource(*f.cache, f, first, &s, PiecesOnly());
  REQUIRE(s.ok());
  const auto before = f.cache->Stats();

  std::vector<ChunkPiece> pieces;
  for (const Ask& a : asks) pieces.push_back(ChunkPiece{a.chunk, a.offset, a.length, nullptr});
  ReadOptions keep = PiecesOnly();
  keep.keep_only = true;
  std::vector<size_t> done;
  keep.piece_done = [&](size_t i) { done.push_back(i); };
  REQUIRE(f.cache->ReadPieces(f.dataset, 0, pieces, keep).ok());
  auto st = f.cache->Stats();
  CHECK(st.runs_kept - before.runs_kept == asks.size() - first.size());
  CHECK(st.served_upstream_bytes - before.served_upstream_bytes == SumLengths(asks) - SumLengths(first));
  CHECK(st.upstream_fetched_chunks == 0);
  // piece_done (where the upstream reports pieces as they land) names fetched pieces only, by
  // their index among the caller's pieces, each once.
  std::sort(done.begin(), done.end());
  CHECK(std::adjacent_find(done.begin(), done.end()) == done.end());
  for (size_t i : done) CHECK(i >= first.size());

  // A keep-only read that names a destination is refused before anything is fetched.
  const uint64_t calls = f.upstream->calls.load();
  uint8_t byte = 0;
  const ChunkPiece with_dest{asks[0].chunk, asks[0].offset, 1, &byte};
  CHECK(f.cache->ReadPieces(f.dataset, 0, std::span<const ChunkPiece>(&with_dest, 1), keep).code() ==
        StatusCode::kInvalidArgument);
  CHECK(f.upstream->calls.load() == calls);

  // Every piece is held now: the upstream is down and each reads back exact, from DRAM, then
  // from NVMe after a restart.
  f.upstream->fail = true;
  Outcome out = ReadSource(*f.cache, f, asks, &s, PiecesOnly());
  REQUIRE(s.ok());
  CHECK(out.wrong == "");
  CHECK(out.guard_damage == 0);
  f.cache->Flush();
  f.Open(o);
  f.upstream->fail = true;
  out = ReadSource(*f.cache, f, asks, &s, PiecesOnly());
  REQUIRE(s.ok());
  CHECK(out.wrong == "");
  CHECK(f.cache->Stats().nvme.checksum_failures == 0);
}

TEST_CASE("cached runs: a corrupt run on NVMe is detected, counted, refetched exact and never served",
          "[cache][source][pieces][runs][faults]") {
  TempDir dir;
  const auto o = SmallCacheOptions(dir / "cache");
  CacheFixture f(o);
  const std::vector<Ask> asks = {{2, 3 * kBlock + 5, 20000, 0}, {5, 100, 3000, 1}};
  Status s;
  REQUIRE(ReadSource(*f.cache, f, asks, &s, PiecesOnly()).wrong == "");
  REQUIRE(s.ok());
  f.cache->Flush();
  f.cache.reset();
  const Hash128 vid = VersionId(f.dataset->version);
  {
    auto db = IndexDb::Open(o.dir + "/index", 1 << 20);
    REQUIRE(db.ok());
    const RunId id{ChunkKey{vid, 0, 2}, asks[0].offset, asks[0].length};
    CorruptData(o.dir, **db, RunKey(id), 777);
  }
  f.Open(o);
  const uint64_t calls_before = f.upstream->calls.load();
  Outcome out = ReadSource(*f.cache, f, asks, &s, PiecesOnly());
  REQUIRE(s.ok());
  CHECK(out.wrong == "");
  CHECK(out.guard_damage == 0);
  auto st = f.cache->Stats();
  CHECK(st.nvme.checksum_failures == 1);
  CHECK(st.run_hits == 1);         // chunk 5's run
  CHECK(st.hits_nvme == 1);
  CHECK(f.upstream->calls.load() == calls_before + 1);  // chunk 2's piece, refetched
  CHECK(st.runs_kept == 1);        // and kept again
  // The refetched run is stored again and then read from NVMe without another failure.
  f.cache->Flush();
  f.Open(o);
  f.upstream->fail = true;
  out = ReadSource(*f.cache, f, asks, &s, PiecesOnly());
  REQUIRE(s.ok());
  CHECK(out.wrong == "");
  st = f.cache->Stats();
  CHECK(st.nvme.checksum_failures == 0);
  CHECK(st.run_hits == asks.size());
}

// =============================================================================================
// CachedSource::Prefetch

TEST_CASE("cached prefetch: fetches only what no tier holds, and reads nothing it already holds",
          "[cache][source][prefetch]") {
  TempDir dir;
  const auto o = SmallCacheOptions(dir / "cache");
  CacheFixture f(o);
  const auto& ds = f.dataset;

  SECTION("an empty cache fetches the whole range; a second call fetches and reads nothing") {
    REQUIRE(f.cache->Prefetch(ds, 0, 0, 8, ReadOptions()).ok());
    CHECK(f.cache->Stats().upstream_fetched_chunks == 8);
    CHECK(f.upstream->calls.load() == 1);
    // Chunks still in the write queue are held too: nothing fetched, nothing served from the
    // queue (a ReadChunks would count each as a memory hit).
    const auto queued = f.cache->Stats();
    REQUIRE(f.cache->Prefetch(ds, 0, 0, 8, ReadOptions()).ok());
    CHECK(f.cache->Stats().upstream_fetched_chunks == 8);
    CHECK(f.cache->Stats().hits_dram == queued.hits_dram);
    f.cache->Flush();
    CHECK(f.cache->Stats().nvme.entries == 8);
    const auto before = f.cache->Stats();
    REQUIRE(f.cache->Prefetch(ds, 0, 0, 8, ReadOptions()).ok());
    REQUIRE(f.cache->Prefetch(ds, 0, 2, 3, ReadOptions()).ok());
    const auto after = f.cache->Stats();
    CHECK(after.upstream_fetched_chunks == 8);
    CHECK(f.upstream->calls.load() == 1);
    CHECK(after.hits_nvme == before.hits_nvme);
    CHECK(after.hits_dram == before.hits_dram);
    CHECK(after.served_nvme_bytes == before.served_nvme_bytes);
    CHECK(after.served_dram_bytes == before.served_dram_bytes);
    CHECK(after.nvme.hits == before.nvme.hits);
    CHECK(after.nvme.misses == before.nvme.misses);
    // What was prefetched reads back exact without the upstream.
    std::mt19937_64 rng(17);
    Status s;
    const Outcome out = ReadSource(*f.cache, f, DatasetAsks(f, {0, 4, 7}, 3, rng), &s);
    REQUIRE(s.ok());
    CHECK(out.wrong == "");
    CHECK(f.upstream->calls.load() == 1);
  }

  SECTION("with part of the range cached, only the missing chunks are fetched, one run per gap") {
    REQUIRE(f.cache->Prefetch(ds, 0, 1, 2, ReadOptions()).ok());
    REQUIRE(f.cache->Prefetch(ds, 0, 5, 1, ReadOptions()).ok());
    f.cache->Flush();
    CHECK(f.cache->Stats().upstream_fetched_chunks == 3);
    const uint64_t calls = f.upstream->calls.load();
    const auto before = f.cache->Stats();
    REQUIRE(f.cache->Prefetch(ds, 0, 0, 8, ReadOptions()).ok());
    const auto after = f.cache->Stats();
    CHECK(after.upstream_fetched_chunks == 8);
    CHECK(f.upstream->calls.load() - calls == 3);  // [0, 1), [3, 5), [6, 8)
    for (uint64_t c = 0; c < 8; ++c) CHECK(f.upstream->FetchCount(0, c) == 1);
    CHECK(after.nvme.hits == before.nvme.hits);  // the cached ones were not read
    CHECK(after.served_nvme_bytes == before.served_nvme_bytes);
  }

  SECTION("with a DRAM tier, held chunks are neither fetched nor read") {
    auto o2 = o;
    o2.memory_bytes = 64ull << 20;
    f.Open(o2);
    REQUIRE(f.cache->Prefetch(ds, 0, 0, 4, ReadOptions()).ok());
    f.cache->Flush();
    const auto before = f.cache->Stats();
    REQUIRE(f.cache->Prefetch(ds, 0, 0, 6, ReadOptions()).ok());
    const auto after = f.cache->Stats();
    CHECK(after.upstream_fetched_chunks - before.upstream_fetched_chunks == 2);
    CHECK(after.hits_dram == before.hits_dram);
    CHECK(after.served_dram_bytes == before.served_dram_bytes);
  }

  SECTION("a range outside the shard is InvalidArgument") {
    CHECK(f.cache->Prefetch(ds, 0, 6, 3, ReadOptions()).code() == StatusCode::kInvalidArgument);
    CHECK(f.upstream->calls.load() == 0);
  }
}

// =============================================================================================
// CachedSource::ReadPiecesFromMemory and Holds (the non-blocking shortcuts of batch assembly)

namespace {

// Answer of one ReadPiecesFromMemory call over a list of asks (chunk indexes of shard 0).
struct MemoryRead {
  bool copied = false;
  std::string wrong;          // asks copied with wrong bytes, one per line (when copied)
  uint64_t dest_written = 0;  // destination bytes that no longer hold kGuard (when not copied)
  uint64_t guard_damage = 0;  // bytes outside every destination that were written
};

MemoryRead ReadFromMemory(ChunkSource& source, const CacheFixture& f, const std::vector<Ask>& asks,
                          FetchPriority priority) {
  Slots slots(asks);
  std::vector<ChunkPiece> pieces;
  for (size_t i = 0; i < asks.size(); ++i) {
    pieces.push_back(ChunkPiece{asks[i].chunk, asks[i].offset, asks[i].length, slots.dest(i)});
  }
  MemoryRead out;
  out.copied = source.ReadPiecesFromMemory(f.dataset, 0, pieces, priority);
  for (size_t i = 0; i < asks.size(); ++i) {
    const Ask& a = asks[i];
    const uint8_t* d = slots.dest(i);
    if (out.copied) {
      if (std::memcmp(d, f.Expected(a.chunk)->bytes.data() + a.offset, a.length) != 0) out.wrong += Describe(a) + "\n";
    } else {
      out.dest_written += static_cast<uint64_t>(std::count_if(d, d + a.length, [](uint8_t b) { return b != kGuard; }));
    }
  }
  out.guard_damage = slots.GuardDamage();
  return out;
}

// The counters a call that serves nothing and fetches nothing must leave alone.
void CheckNothingServed(const CacheStats& before, const CacheStats& after) {
  CHECK(after.hits_dram == before.hits_dram);
  CHECK(after.hits_nvme == before.hits_nvme);
  CHECK(after.misses == before.misses);
  CHECK(after.served_dram_bytes == before.served_dram_bytes);
  CHECK(after.served_nvme_bytes == before.served_nvme_bytes);
  CHECK(after.served_upstream_bytes == before.served_upstream_bytes);
  CHECK(after.upstream_calls == before.upstream_calls);
  CHECK(after.nvme.hits == before.nvme.hits);      // no NVMe read
  CHECK(after.nvme.misses == before.nvme.misses);  // not even an attempted one
}

// Room for one chunk of the pieces dataset (1 MiB + 4321 bytes) in DRAM, not two.
constexpr uint64_t kOneChunkOfDram = (3ull << 20) / 2;

}  // namespace

TEST_CASE("cached pieces from memory: pieces of chunks in DRAM are copied exact, counted as DRAM hits, "
          "without the upstream or NVMe",
          "[cache][source][pieces][memory]") {
  TempDir dir;
  auto o = SmallCacheOptions(dir / "cache");
  o.memory_bytes = 64ull << 20;
  CacheFixture f(o);
  REQUIRE(f.cache->Prefetch(f.dataset, 0, 1, 2, ReadOptions()).ok());
  REQUIRE(f.cache->Prefetch(f.dataset, 0, 6, 1, ReadOptions()).ok());
  f.cache->Flush();  // nothing left in the write queue: DRAM alone answers
  REQUIRE(f.cache->Stats().dram_entries == 3);
  const uint64_t calls = f.upstream->calls.load();
  // Planned order 1, 2, 6: demand reads of all three move the clock to 3.
  const std::vector<ChunkRef> order = {{0, 1}, {0, 2}, {0, 6}};
  f.cache->SetFutureAccessOrder(f.dataset->version, 0, order);
  REQUIRE(f.cache->access_plan().Now(f.dataset->version) == 0);
  std::mt19937_64 rng(41);
  const std::vector<Ask> asks = DatasetAsks(f, {1, 2, 6}, 5, rng);

  // Prefetch priority: served and counted, but the plan's clock stays put.
  auto before = f.cache->Stats();
  MemoryRead r = ReadFromMemory(*f.cache, f, asks, FetchPriority::kPrefetch);
  REQUIRE(r.copied);
  CHECK(r.wrong == "");
  CHECK(r.guard_damage == 0);
  auto after = f.cache->Stats();
  CHECK(after.hits_dram - before.hits_dram == asks.size());
  CHECK(after.served_dram_bytes - before.served_dram_bytes == SumLengths(asks));
  CHECK(f.cache->access_plan().Now(f.dataset->version) == 0);

  // Demand priority: the same, and the reads advance the clock.
  before = after;
  r = ReadFromMemory(*f.cache, f, asks, FetchPriority::kDemand);
  REQUIRE(r.copied);
  CHECK(r.wrong == "");
  CHECK(r.guard_damage == 0);
  after = f.cache->Stats();
  CHECK(after.hits_dram - before.hits_dram == asks.size());
  CHECK(after.served_dram_bytes - before.served_dram_bytes == SumLengths(asks));
  CHECK(f.cache->access_plan().Now(f.dataset->version) == 3);

  // Neither call went below DRAM.
  CHECK(f.upstream->calls.load() == calls);
  CHECK(after.hits_nvme == before.hits_nvme);
  CHECK(after.misses == before.misses);
  CHECK(after.served_upstream_bytes == before.served_upstream_bytes);
  CHECK(after.nvme.hits == before.nvme.hits);
  CHECK(after.nvme.misses == before.nvme.misses);
}

TEST_CASE("cached pieces from memory: when one piece's chunk is not in memory, nothing is copied, counted, "
          "read or fetched",
          "[cache][source][pieces][memory]") {
  TempDir dir;
  auto o = SmallCacheOptions(dir / "cache");
  o.memory_bytes = kOneChunkOfDram;
  CacheFixture f(o);
  // Chunk 1, then chunk 2: chunk 2 pushes chunk 1 out of DRAM; both are stored on NVMe.
  REQUIRE(f.cache->Prefetch(f.dataset, 0, 1, 1, ReadOptions()).ok());
  REQUIRE(f.cache->Prefetch(f.dataset, 0, 2, 1, ReadOptions()).ok());
  f.cache->Flush();
  REQUIRE(f.cache->Stats().dram_entries == 1);
  REQUIRE(f.cache->Stats().nvme.entries == 2);
  const uint64_t calls = f.upstream->calls.load();
  const std::vector<ChunkRef> order = {{0, 1}, {0, 2}, {0, 5}};
  f.cache->SetFutureAccessOrder(f.dataset->version, 0, order);
  const uint64_t len2 = f.Length(2);
  // The in-DRAM chunk's pieces come first: a copy made before the miss is found would show.
  const std::vector<Ask> in_dram = {{2, 100, 5000, 0}, {2, len2 - 10, 10, 1}, {2, 0, len2, 0}};

  SECTION("a chunk that is only on NVMe") {
    std::vector<Ask> asks = in_dram;
    asks.push_back({1, 0, 1000, 3});
    asks.push_back({2, 7000, 20, 0});
    const auto before = f.cache->Stats();
    const MemoryRead r = ReadFromMemory(*f.cache, f, asks, FetchPriority::kDemand);
    CHECK_FALSE(r.copied);
    CHECK(r.dest_written == 0);
    CHECK(r.guard_damage == 0);
    const auto after = f.cache->Stats();
    CheckNothingServed(before, after);
    CHECK(after.dram_entries == 1);  // chunk 1 was not brought back into DRAM
    CHECK(f.cache->access_plan().Now(f.dataset->version) == 0);
  }

  SECTION("a chunk no tier holds") {
    std::vector<Ask> asks = in_dram;
    asks.push_back({5, 10, 100, 0});
    const auto before = f.cache->Stats();
    const MemoryRead r = ReadFromMemory(*f.cache, f, asks, FetchPriority::kDemand);
    CHECK_FALSE(r.copied);
    CHECK(r.dest_written == 0);
    CHECK(r.guard_damage == 0);
    CheckNothingServed(before, f.cache->Stats());
    CHECK(f.upstream->FetchCount(0, 5) == 0);
    CHECK(f.cache->access_plan().Now(f.dataset->version) == 0);
  }

  // The refusal was the missing chunk's doing: chunk 2 alone is served from DRAM.
  const MemoryRead alone = ReadFromMemory(*f.cache, f, in_dram, FetchPriority::kDemand);
  CHECK(alone.copied);
  CHECK(alone.wrong == "");
  CHECK(f.upstream->calls.load() == calls);
}

TEST_CASE("cached pieces from memory: an invalid piece is refused without a copy, a fetch or a crash",
          "[cache][source][pieces][memory]") {
  TempDir dir;
  auto o = SmallCacheOptions(dir / "cache");
  o.memory_bytes = 64ull << 20;
  CacheFixture f(o);
  REQUIRE(f.cache->Prefetch(f.dataset, 0, 0, 8, ReadOptions()).ok());
  f.cache->Flush();
  REQUIRE(f.cache->Stats().dram_entries == 8);
  const uint64_t calls = f.upstream->calls.load();
  const uint64_t len1 = f.Length(1);
  const uint64_t len7 = f.Length(7);
  std::vector<uint8_t> buf(4096, kGuard);
  uint8_t* b = buf.data();
  // A valid piece of an in-DRAM chunk first, then the bad one.
  const ChunkPiece good{1, 0, 10, b};
  const std::vector<std::pair<std::string, std::vector<ChunkPiece>>> cases = {
      {"runs past the end of its chunk", {good, {7, len7 - 5, 10, b + 100}}},
      {"starts at the end of its chunk", {good, {1, len1, 1, b + 100}}},
      {"longer than its chunk", {good, {1, 0, len1 + 1, b + 100}}},
      {"offset + length wraps around", {good, {1, UINT64_MAX - 5, 10, b + 100}}},
      {"length wraps around", {good, {1, 10, UINT64_MAX - 5, b + 100}}},
      {"a chunk beyond the shard (chunks 0..7)", {good, {8, 0, 1, b + 100}}},
      {"a chunk far beyond the shard", {good, {UINT64_MAX, 0, 1, b + 100}}},
  };
  const auto before = f.cache->Stats();
  for (const auto& [what, pieces] : cases) {
    INFO(what);
    CHECK_FALSE(f.cache->ReadPiecesFromMemory(f.dataset, 0, pieces, FetchPriority::kDemand));
    CHECK(std::all_of(buf.begin(), buf.end(), [](uint8_t x) { return x == kGuard; }));
  }
  {
    INFO("a shard the dataset does not have");
    const std::vector<ChunkPiece> pieces = {{0, 0, 10, b}};
    CHECK_FALSE(f.cache->ReadPiecesFromMemory(f.dataset, 1, pieces, FetchPriority::kDemand));
    CHECK(std::all_of(buf.begin(), buf.end(), [](uint8_t x) { return x == kGuard; }));
  }
  CheckNothingServed(before, f.cache->Stats());
  CHECK(f.upstream->calls.load() == calls);
  // The chunks were there: the good piece alone is copied.
  const std::vector<ChunkPiece> just_good = {good};
  CHECK(f.cache->ReadPiecesFromMemory(f.dataset, 0, just_good, FetchPriority::kDemand));
  CHECK(std::memcmp(b, f.Expected(1)->bytes.data(), 10) == 0);
}

TEST_CASE("cached holds: true only when some tier holds every chunk of the range; never fetches or reads",
          "[cache][source][holds]") {
  TempDir dir;
  auto check_ranges = [](CacheFixture& f, const std::vector<std::pair<uint64_t, uint64_t>>& held,
                                const std::vector<std::pair<uint64_t, uint64_t>>& not_held) {
    const uint64_t calls = f.upstream->calls.load();
    const auto before = f.cache->Stats();
    for (const auto& [first, count] : held) {
      INFO("chunks [" << first << ", " << first + count << ")");
      CHECK(f.cache->Holds(f.dataset, 0, first, count));
    }
    for (const auto& [first, count] : not_held) {
      INFO("chunks [" << first << ", " << first + count << ")");
      CHECK_FALSE(f.cache->Holds(f.dataset, 0, first, count));
    }
    CheckNothingServed(before, f.cache->Stats());
    CHECK(f.upstream->calls.load() == calls);
  };

  SECTION("chunks stored on NVMe only (no DRAM tier)") {
    CacheFixture f(SmallCacheOptions(dir / "cache"));  // memory_bytes = 0
    REQUIRE(f.cache->Prefetch(f.dataset, 0, 1, 2, ReadOptions()).ok());
    REQUIRE(f.cache->Prefetch(f.dataset, 0, 5, 1, ReadOptions()).ok());
    f.cache->Flush();
    REQUIRE(f.cache->Stats().dram_entries == 0);
    REQUIRE(f.cache->Stats().nvme.entries == 3);
    check_ranges(f, {{1, 2}, {1, 1}, {2, 1}, {5, 1}},
                 {{0, 1}, {0, 3}, {1, 3}, {2, 4}, {4, 2}, {0, 8}, {7, 1}});
    // After a restart, the recovered index still counts.
    f.Open(SmallCacheOptions(dir / "cache"));
    check_ranges(f, {{1, 2}, {5, 1}}, {{0, 3}, {3, 1}});
  }

  SECTION("chunks in DRAM (no NVMe tier), and DRAM evictions") {
    CacheOptions o;
    o.size_bytes = 0;
    o.memory_bytes = 64ull << 20;
    CacheFixture f(o);
    REQUIRE(f.cache->Prefetch(f.dataset, 0, 2, 3, ReadOptions()).ok());
    check_ranges(f, {{2, 3}, {3, 1}, {4, 1}}, {{1, 2}, {4, 2}, {0, 8}});
    // Room for one chunk: chunk 3 pushes chunk 2 out.
    o.memory_bytes = kOneChunkOfDram;
    f.Open(o);
    REQUIRE(f.cache->Prefetch(f.dataset, 0, 2, 1, ReadOptions()).ok());
    REQUIRE(f.cache->Prefetch(f.dataset, 0, 3, 1, ReadOptions()).ok());
    check_ranges(f, {{3, 1}}, {{2, 1}, {2, 2}});
  }

  SECTION("a range outside the shard is not held, even when the shard is all cached") {
    CacheFixture f(SmallCacheOptions(dir / "cache"));
    REQUIRE(f.cache->Prefetch(f.dataset, 0, 0, 8, ReadOptions()).ok());
    f.cache->Flush();
    check_ranges(f, {{0, 8}}, {{6, 3}, {8, 1}, {0, 9}, {1, UINT64_MAX}, {UINT64_MAX, 2}});
    const uint64_t calls = f.upstream->calls.load();
    CHECK_FALSE(f.cache->Holds(f.dataset, 1, 0, 1));  // the dataset has one shard
    CHECK(f.upstream->calls.load() == calls);
  }
}

// =============================================================================================
// ChunkSource::ReadPieces default (FakeUpstream does not override it)

TEST_CASE("chunk source pieces: the default copies pieces in any order from one read per run of chunks",
          "[cache][source][pieces]") {
  CacheFixture f(CacheOptions{});  // only for the dataset and the upstream
  FakeUpstream& up = *f.upstream;
  std::mt19937_64 rng(23);
  const std::vector<Ask> asks = DatasetAsks(f, {1, 2, 3, 5, 7}, 4, rng);
  Status s;
  const Outcome out = ReadSource(up, f, asks, &s);
  REQUIRE(s.ok());
  CHECK(out.wrong == "");
  CHECK(out.guard_damage == 0);
  CHECK(up.calls.load() == 3);  // [1, 4), [5, 6), [7, 8)
  for (uint64_t c : {1, 2, 3, 5, 7}) CHECK(up.FetchCount(0, c) == 1);

  SECTION("a piece outside its chunk is InvalidArgument naming the chunk") {
    uint8_t buf[64];
    const uint64_t len = f.Length(2);
    const std::vector<ChunkPiece> pieces = {{1, 0, 10, buf}, {2, len - 3, 4, buf + 10}};
    const Status bad = up.ReadPieces(f.dataset, 0, pieces, ReadOptions());
    CHECK(bad.code() == StatusCode::kInvalidArgument);
    CHECK_THAT(bad.message(), Catch::Contains("chunk 2"));
    CHECK_THAT(bad.message(), Catch::Contains(std::to_string(len)));
  }

  SECTION("a piece of a chunk beyond the shard is InvalidArgument") {
    uint8_t buf[8];
    const std::vector<ChunkPiece> pieces = {{8, 0, 1, buf}};
    CHECK(up.ReadPieces(f.dataset, 0, pieces, ReadOptions()).code() == StatusCode::kInvalidArgument);
  }

  SECTION("no pieces is a no-op") {
    const uint64_t calls = up.calls.load();
    CHECK(up.ReadPieces(f.dataset, 0, {}, ReadOptions()).ok());
    CHECK(up.calls.load() == calls);
  }
}
