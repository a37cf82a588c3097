// Tests of SegmentManager (segment_manager.h): the budget formula, making room for one more
// segment per policy, the free-space floor, and the open segment — without disk (segments have
// no files here).
#include <catch2/catch.hpp>

#include <memory>
#include <set>
#include <vector>

#include "daemon/cache/lru_policy.h"
#include "daemon/cache/segment_manager.h"
#include "daemon/cache/static_policy.h"

using namespace shardcache::cache;

namespace {

constexpr uint64_t kSeg = 1ull << 20;
constexpr uint64_t kReserve = 2ull << 20;

// Room for exactly `segments` segments with the index at or below the reserve.
CacheOptions Options(size_t segments) {
  CacheOptions o;
  o.segment_bytes = kSeg;
  o.index_reserve_bytes = kReserve;
  o.size_bytes = segments * kSeg + kReserve + kDirOverheadBytes;
  return o;
}

// A policy that declines admissions and records what it was offered.
class RecordingPolicy : public EvictionPolicy {
 public:
  const char* name() const override { return "recording"; }
  std::optional<uint32_t> PickVictim(std::span<const SegmentSummary> segments,
                                     std::optional<uint64_t> incoming) override {
    offered.clear();
    for (const auto& s : segments) offered.push_back(s.id);
    if (incoming || segments.empty()) return std::nullopt;
    return segments.front().id;
  }
  bool AdmitIntoFreedSpace(uint64_t) override { return admit; }
  std::vector<uint32_t> offered;
  bool admit = true;
};

// Fills the table with `n` sealed segments, each holding one chunk, the last one added open.
void Fill(SegmentManager& m, ChunkIndex& index, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const uint32_t id = m.NextId();
    m.SealOpen();
    m.AddOpen(id, nullptr);
    const auto slot = m.Reserve(8192);
    index.Put(1000 + id, Loc{id, 8192, slot.offset});
  }
}

}  // namespace

TEST_CASE("segment manager: the budget formula counts segments, the index allowance and the directories",
          "[cache][segment_manager]") {
  LruPolicy lru;
  ChunkIndex index;
  const CacheOptions o = Options(4);
  SegmentManager m(o, o.size_bytes, &lru, &index);
  CHECK(m.IndexAllowance(0) == kReserve);
  CHECK(m.IndexAllowance(kReserve / 2) == kReserve);  // + min(8 MiB, reserve / 2) = reserve
  CHECK(m.IndexAllowance(kReserve) == kReserve + kReserve / 2);
  CacheOptions big = o;
  big.index_reserve_bytes = 64ull << 20;
  SegmentManager mb(big, big.size_bytes, &lru, &index);
  CHECK(mb.IndexAllowance(64ull << 20) == (64ull << 20) + kIndexGrowthBytes);  // growth capped at 8 MiB
  CHECK(m.AllocatedBytes(4, 0) == o.size_bytes);
  CHECK(m.AllocatedBytes(0, kReserve) == kReserve + kReserve / 2 + kDirOverheadBytes);
}

TEST_CASE("segment manager: room is made without eviction while one more segment fits", "[cache][segment_manager]") {
  LruPolicy lru;
  ChunkIndex index;
  const CacheOptions o = Options(4);
  SegmentManager m(o, o.size_bytes, &lru, &index);
  std::vector<std::shared_ptr<SegmentFile>> victims;
  for (int i = 0; i < 4; ++i) {
    REQUIRE(m.MakeRoom(0, INT64_MAX, 1, &victims) == SegmentManager::Room::kMade);
    Fill(m, index, 1);
  }
  CHECK(victims.empty());
  CHECK(m.count() == 4);
  CHECK(m.evicted() == 0);
}

TEST_CASE("segment manager: at the budget the least recently used sealed segment is evicted, never the open one",
          "[cache][segment_manager]") {
  LruPolicy lru;
  ChunkIndex index;
  const CacheOptions o = Options(4);
  SegmentManager m(o, o.size_bytes, &lru, &index);
  Fill(m, index, 4);  // segments 1..4, 4 open
  REQUIRE(m.MarkRead(1) == nullptr);  // no file here; 1 is now the most recently used
  CHECK(m.open_id() == 4);
  std::vector<std::shared_ptr<SegmentFile>> victims;
  // INT64_MAX: free space not measurable (HeadroomAboveFloor). An eviction for the budget once
  // overflowed headroom + freed into "below the floor" and evicted every sealed segment.
  CHECK(m.MakeRoom(0, INT64_MAX, 1, &victims) == SegmentManager::Room::kMade);
  CHECK(victims.size() == 1);
  CHECK(m.count() == 3);
  CHECK_FALSE(m.Contains(2));  // the least recently used
  CHECK_FALSE(index.Contains(1002));
  CHECK(index.Contains(1001));
  CHECK(m.evicted() == 1);
  // A measured index over the reserve takes its growth from the segments: two go.
  victims.clear();
  Fill(m, index, 1);  // 4 segments again
  CHECK(m.MakeRoom(kReserve, INT64_MAX, 1, &victims) == SegmentManager::Room::kMade);
  CHECK(victims.size() == 2);
  CHECK(m.AllocatedBytes(m.count() + 1, kReserve) <= o.size_bytes);
}

TEST_CASE("segment manager: a policy that keeps what it has declines, and nothing is evicted", "[cache][segment_manager]") {
  StaticPolicy keep;
  ChunkIndex index;
  const CacheOptions o = Options(3);
  SegmentManager m(o, o.size_bytes, &keep, &index);
  Fill(m, index, 3);
  std::vector<std::shared_ptr<SegmentFile>> victims;
  CHECK(m.MakeRoom(0, INT64_MAX, 1, &victims) == SegmentManager::Room::kDeclined);
  CHECK(victims.empty());
  CHECK(m.count() == 3);
  // Forced (shrink, floor) the same policy must give a segment back.
  CHECK(m.PickVictim(std::nullopt).has_value());
}

TEST_CASE("segment manager: below the free-space floor segments are given back, then the disk is full",
          "[cache][segment_manager]") {
  RecordingPolicy policy;
  ChunkIndex index;
  const CacheOptions o = Options(8);
  SegmentManager m(o, o.size_bytes, &policy, &index);
  Fill(m, index, 3);  // 1, 2 sealed; 3 open
  std::vector<std::shared_ptr<SegmentFile>> victims;
  // Within the budget but 1.5 segments short of the floor: two forced evictions.
  CHECK(m.MakeRoom(0, -static_cast<int64_t>(kSeg / 2), 1, &victims) == SegmentManager::Room::kMade);
  CHECK(victims.size() == 2);
  CHECK(m.count() == 1);
  CHECK(policy.offered.size() == 1);  // only sealed segments are offered: the open one never
  // Nothing sealed is left to give back.
  victims.clear();
  CHECK(m.MakeRoom(0, 0, 1, &victims) == SegmentManager::Room::kDiskFull);
  CHECK(victims.empty());
  CHECK(m.count() == 1);
}

TEST_CASE("segment manager: admission into freed space is asked only at the budget", "[cache][segment_manager]") {
  RecordingPolicy policy;
  policy.admit = false;
  ChunkIndex index;
  const CacheOptions o = Options(2);
  SegmentManager m(o, o.size_bytes, &policy, &index);
  Fill(m, index, 1);
  CHECK_FALSE(m.DeclinesIntoFreedSpace(1));  // room for another segment
  Fill(m, index, 1);
  CHECK(m.DeclinesIntoFreedSpace(1));
  policy.admit = true;
  CHECK_FALSE(m.DeclinesIntoFreedSpace(1));
}

TEST_CASE("segment manager: over the limits after a shrink; the open segment is the last forced victim",
          "[cache][segment_manager]") {
  LruPolicy lru;
  ChunkIndex index;
  const CacheOptions o = Options(4);
  SegmentManager m(o, o.size_bytes, &lru, &index);
  Fill(m, index, 2);
  CHECK_FALSE(m.OverLimits(0));
  CHECK(m.OverLimits(-1));  // below the floor
  m.SetSize(Options(1).size_bytes, o.size_bytes);
  CHECK(m.configured_size_bytes() == o.size_bytes);
  REQUIRE(m.OverLimits(0));
  auto v = m.PickForcedVictim();
  REQUIRE(v);
  CHECK(*v == 1);
  m.Evict(*v);
  CHECK_FALSE(m.OverLimits(0));
  m.SetSize(0, 0);
  v = m.PickForcedVictim();
  REQUIRE(v);
  CHECK(*v == 2);  // the open one
  m.Evict(*v);
  CHECK(m.open_id() == 0);
  CHECK_FALSE(m.PickForcedVictim());
  CHECK(index.size() == 0);
}

TEST_CASE("segment manager: the open segment fills, seals, and commits collect its record", "[cache][segment_manager]") {
  LruPolicy lru;
  ChunkIndex index;
  const CacheOptions o = Options(4);
  SegmentManager m(o, o.size_bytes, &lru, &index);
  CHECK_FALSE(m.OpenHasRoom(4096));  // none open
  m.AddOpen(m.NextId(), nullptr);
  CHECK(m.OpenHasRoom(kSeg));
  CHECK(m.Reserve(kSeg - 4096).offset == 0);
  CHECK(m.OpenHasRoom(4096));
  CHECK_FALSE(m.OpenHasRoom(8192));
  const auto slot = m.Reserve(4096);
  CHECK(slot.segment == 1);
  CHECK(slot.offset == kSeg - 4096);

  std::vector<std::pair<uint32_t, SegmentRecord>> records;
  std::vector<std::shared_ptr<SegmentFile>> to_sync;
  m.CollectRecords({1}, 1234, &records, &to_sync);
  REQUIRE(records.size() == 1);
  CHECK(records[0].second.durable_bytes == kSeg);
  CHECK(records[0].second.flags == 0);
  CHECK(to_sync.size() == 1);
  CHECK_FALSE(m.AnyRecordDirty());
  CHECK(m.DurableBytes(1) == 0u);
  m.RaiseDurable(records);
  CHECK(m.DurableBytes(1) == kSeg);

  m.SealOpen();
  CHECK(m.open_id() == 0);
  CHECK(m.AnyRecordDirty());
  records.clear();
  to_sync.clear();
  m.CollectRecords({}, 1234, &records, &to_sync);
  REQUIRE(records.size() == 1);
  CHECK(records[0].second.flags == kSegmentSealed);
  CHECK(to_sync.empty());
}

TEST_CASE("segment manager: a failed write seals the segment at the failed extent", "[cache][segment_manager]") {
  LruPolicy lru;
  ChunkIndex index;
  const CacheOptions o = Options(4);
  SegmentManager m(o, o.size_bytes, &lru, &index);
  m.AddOpen(m.NextId(), nullptr);
  m.Reserve(8192);
  m.Reserve(8192);
  m.SealAfterFailedWrite(1, 8192);
  CHECK(m.open_id() == 0);
  std::vector<std::pair<uint32_t, SegmentRecord>> records;
  std::vector<std::shared_ptr<SegmentFile>> to_sync;
  m.CollectRecords({1}, 0, &records, &to_sync);
  REQUIRE(records.size() == 1);
  CHECK(records[0].second.durable_bytes == 8192);
  CHECK(records[0].second.flags == kSegmentSealed);
}

TEST_CASE("segment manager: segments emptied by a dataset eviction are freed, the open one is kept",
          "[cache][segment_manager]") {
  LruPolicy lru;
  ChunkIndex index;
  const CacheOptions o = Options(4);
  SegmentManager m(o, o.size_bytes, &lru, &index);
  Fill(m, index, 3);  // chunk 1000+id in segment id; 3 open
  index.Put(2000, Loc{2, 10, 8192});
  for (uint32_t id : {1u, 2u, 3u}) index.Drop(1000 + id, *index.Find(1000 + id));
  const auto victims = m.EvictEmpty({1, 2, 3, 9});
  CHECK(victims.size() == 1);
  CHECK_FALSE(m.Contains(1));
  CHECK(m.Contains(2));  // still holds chunk 2000
  CHECK(m.Contains(3));  // open
}
