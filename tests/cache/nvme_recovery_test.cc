// Tests of NVMe tier start-up (nvme_recovery.h) on a forged index and segment files, without a
// store: what is kept, what is dropped, and the state the writer resumes from. (Whole-store
// restarts are in nvme_store_test.cc and crash_test.cc.)
#include <catch2/catch.hpp>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <memory>

#include "daemon/cache/lru_policy.h"
#include "daemon/cache/nvme_recovery.h"
#include "daemon/source/chunk_key.h"
#include "testing/temp_dir.h"

using namespace shardcache;
using namespace shardcache::cache;
using namespace shardcache::testing;

namespace {

constexpr uint64_t kSeg = 1ull << 20;

EntryRecord Entry(uint64_t chunk, uint32_t length = 4096) {
  EntryRecord rec;
  rec.length = length;
  rec.version_high = 1;
  rec.version_low = 2;
  rec.chunk = chunk;
  return rec;
}

uint64_t Fp(uint64_t chunk) { return Fingerprint(ChunkKey{Hash128{1, 2}, 0, chunk}); }

SegmentRecord Record(uint64_t durable, uint64_t last_access_s, bool sealed) {
  SegmentRecord r;
  r.durable_bytes = durable;
  r.last_access_s = last_access_s;
  r.flags = sealed ? kSegmentSealed : 0;
  return r;
}

bool Exists(const std::string& p) { return ::access(p.c_str(), F_OK) == 0; }

}  // namespace

TEST_CASE("nvme recovery: orphans, missing and short segments and untrusted entries are dropped; the rest is indexed",
          "[cache][nvme][recovery]") {
  TempDir dir;
  const std::string d = dir.path();
  {
    auto db = IndexDb::Open(d + "/index", 1 << 20);
    REQUIRE(db.ok());
    REQUIRE(SegmentFile::Create(d, 1, kSeg).ok());
    REQUIRE(SegmentFile::Create(d, 2, kSeg).ok());
    REQUIRE(SegmentFile::Create(d, 3, 4096).ok());  // shorter than its watermark
    REQUIRE(SegmentFile::Create(d, 9, kSeg).ok());  // no record: an orphan
    // Segment 4 has a record and an entry but no file.
    std::vector<std::pair<uint32_t, SegmentRecord>> segs = {
        {1, Record(3 * 4096, 200, true)}, {2, Record(4096, 100, false)}, {3, Record(8192, 50, true)},
        {4, Record(4096, 10, true)}};
    std::vector<EntryPut> puts = {
        {1, 0, Entry(1)},      {1, 4096, Entry(2)},      {1, 8192, Entry(3)},
        {1, 12288, Entry(4)},  // past segment 1's watermark
        {1, 100, Entry(5)},    // not 4 KiB aligned
        {1, 16384, Entry(6, 0)},  // empty
        {2, 0, Entry(1)},      // chunk 1 again, later: it wins
        {3, 0, Entry(7)},      {4, 0, Entry(8)},
        {7, 0, Entry(9)},      // a segment with neither record nor file
    };
    REQUIRE((*db)->Commit(puts, segs, true).ok());
  }
  auto db = IndexDb::Open(d + "/index", 1 << 20);
  REQUIRE(db.ok());
  CacheOptions o;
  o.dir = d;
  o.segment_bytes = kSeg;
  o.index_reserve_bytes = 2ull << 20;
  o.size_bytes = 8 * kSeg;
  LruPolicy lru;
  ChunkIndex index;
  SegmentManager segments(o, o.size_bytes, &lru, &index);
  RecoveryStats stats;
  REQUIRE(Recover(d, **db, &index, &segments, &stats).ok());

  CHECK(stats.orphan_files == 1);
  CHECK_FALSE(Exists(SegmentFile::PathFor(d, 9)));
  CHECK(stats.dropped_segments == 2);  // 3 (short), 4 (missing)
  CHECK_FALSE(Exists(SegmentFile::PathFor(d, 3)));
  CHECK(stats.segments == 2);
  CHECK(segments.count() == 2);
  CHECK(stats.entries == 4);  // 1, 2, 3 in segment 1 and chunk 1 again in segment 2
  CHECK(index.size() == 3);
  REQUIRE(index.Find(Fp(1)));
  CHECK(*index.Find(Fp(1)) == Loc{2, 4096, 0});
  CHECK(index.Fingerprints(1)->size() == 2);
  for (uint64_t c : {4, 5, 6, 7, 8, 9}) CHECK_FALSE(index.Contains(Fp(c)));
  // Entries 4, 5, 6 and 9 dropped one by one (those of 3 and 4 went with their segments).
  CHECK(stats.dropped_entries == 4);

  // Every segment is sealed; one recorded unsealed gets its record rewritten at the next commit.
  CHECK(segments.open_id() == 0);
  CHECK(segments.AnyRecordDirty());
  // New segments get ids past every one seen, orphans included.
  CHECK(segments.NextId() == 10);
  // Ordered by last access: segment 2 (100 s) is older than segment 1 (200 s).
  CHECK(segments.PickVictim(std::nullopt) == 2u);
  CHECK(segments.DurableBytes(1) == 3 * 4096u);
  CHECK(segments.measured_index_bytes() > 0);

  // What was dropped is gone from the index: a second start-up drops nothing more.
  ChunkIndex index2;
  SegmentManager segments2(o, o.size_bytes, &lru, &index2);
  RecoveryStats stats2;
  REQUIRE(Recover(d, **db, &index2, &segments2, &stats2).ok());
  CHECK(stats2.entries == 4);
  CHECK(stats2.dropped_entries == 0);
  CHECK(stats2.dropped_segments == 0);
  CHECK(stats2.orphan_files == 0);
}

TEST_CASE("nvme recovery: an empty directory recovers to an empty tier", "[cache][nvme][recovery]") {
  TempDir dir;
  auto db = IndexDb::Open(dir / "index", 1 << 20);
  REQUIRE(db.ok());
  CacheOptions o;
  o.dir = dir.path();
  o.size_bytes = 1ull << 30;
  LruPolicy lru;
  ChunkIndex index;
  SegmentManager segments(o, o.size_bytes, &lru, &index);
  RecoveryStats stats;
  REQUIRE(Recover(dir.path(), **db, &index, &segments, &stats).ok());
  CHECK(stats.segments == 0);
  CHECK(stats.entries == 0);
  CHECK(index.size() == 0);
  CHECK(segments.NextId() == 1);
  // A directory that cannot be listed is an error, not an empty cache.
  RecoveryStats stats3;
  CHECK_FALSE(Recover(dir / "missing", **db, &index, &segments, &stats3).ok());
}

TEST_CASE("nvme recovery: unusable indexes are the corrupt or foreign ones, and the newest two set aside are kept",
          "[cache][nvme][recovery]") {
  CHECK(IndexUnusable(DataLoss("corrupt")));
  CHECK(IndexUnusable(FailedPrecondition("format 999")));
  CHECK(IndexUnusable(Internal("rocksdb")));
  CHECK(IndexUnusable(InvalidArgument("malformed")));
  CHECK_FALSE(IndexUnusable(PermissionDenied("EACCES")));
  CHECK_FALSE(IndexUnusable(ResourceExhausted("ENOSPC")));
  CHECK_FALSE(IndexUnusable(Unavailable("LOCK held")));

  TempDir dir;
  // Two set aside earlier (older stamps), then this one.
  for (const char* old : {"index.unreadable-20200101T000000Z", "index.unreadable-20210101T000000Z"}) {
    std::filesystem::create_directories(dir / old);
  }
  std::filesystem::create_directories(dir / "index");
  std::ofstream(dir / "index/CURRENT") << "x";
  REQUIRE(SetIndexAside(dir.path(), DataLoss("test")).ok());
  CHECK_FALSE(Exists(dir / "index"));
  CHECK_FALSE(Exists(dir / "index.unreadable-20200101T000000Z"));
  CHECK(Exists(dir / "index.unreadable-20210101T000000Z"));
  int aside = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) {
    aside += e.path().filename().string().rfind("index.unreadable-", 0) == 0;
  }
  CHECK(aside == static_cast<int>(kKeptUnreadableIndexes));
  // Nothing to set aside: an error naming the index.
  CHECK_FALSE(SetIndexAside(dir.path(), DataLoss("test")).ok());
}
