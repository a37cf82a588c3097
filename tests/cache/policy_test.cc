#include <catch2/catch.hpp>

#include "daemon/cache/clairvoyant_policy.h"
#include "tests/cache/epoch_trace.h"
#include "tests/cache/cache_test_util.h"
#include "testing/temp_dir.h"

using namespace shardcache;
using namespace shardcache::cache;
using namespace shardcache::testing;

namespace {

EpochTraceResult Run(EvictionPolicyKind policy) {
  TempDir dir;
  EpochTraceOptions o;
  o.dataset.shards = 2;
  o.dataset.chunk_bytes = 64 << 10;
  o.dataset.shard_bytes = 16ull << 20;   // 2 × 256 chunks = 32 MiB
  o.cache = SmallCacheOptions(dir / "cache");
  o.cache.segment_bytes = 1ull << 20;    // 16 chunks per segment
  o.cache.index_reserve_bytes = 2ull << 20;
  o.cache.size_bytes = (16ull << 20) + (2ull << 20) + 8192;  // 16 segments = half the dataset
  o.cache.eviction = policy;
  auto r = RunEpochTrace(o);
  REQUIRE(r.ok());
  return *r;
}

}  // namespace

TEST_CASE("eviction policies: over three shuffled epochs of a dataset twice the cache, clairvoyant beats or ties static, which beats lru",
          "[cache][policy]") {
  const auto lru = Run(EvictionPolicyKind::kLru);
  const auto stat = Run(EvictionPolicyKind::kStatic);
  const auto clair = Run(EvictionPolicyKind::kClairvoyant);
  WARN("hit ratio epochs 2-3: lru " << lru.HitRatioAfterFirst() << ", static " << stat.HitRatioAfterFirst()
                                    << ", clairvoyant " << clair.HitRatioAfterFirst());
  CHECK(lru.errors == 0);
  CHECK(stat.errors == 0);
  CHECK(clair.errors == 0);
  // "Ties" allows a few chunks: the writer stores asynchronously, so which chunk is the last to
  // land before an epoch's reads begin varies by a chunk or two between runs (seen: static 513
  // hits of 1024, clairvoyant 512).
  const uint64_t tie_chunks = 4;
  REQUIRE(clair.reads_after_first == stat.reads_after_first);
  CHECK(clair.hits_after_first + tie_chunks >= stat.hits_after_first);
  CHECK(stat.HitRatioAfterFirst() > lru.HitRatioAfterFirst());
  // Every chunk is read once per epoch, so no policy can hit more than the cache held when the
  // epoch began (half the dataset); static keeps that half.
  CHECK(stat.HitRatioAfterFirst() > 0.4);
}

TEST_CASE("clairvoyant policy gives up segments nothing is planned for, and bypasses chunks planned later",
          "[cache][policy]") {
  AccessPlan plan;
  const std::string v = "v";
  const auto vid = VersionId(v);
  auto fp = [&](uint64_t c) { return Fingerprint(ChunkKey{vid, 0, c}); };
  // Planned reads: chunk 1, 2, 3, 4 in that order; 10 and 11 are never read again.
  std::vector<ChunkRef> order = {{0, 1}, {0, 2}, {0, 3}, {0, 4}};
  plan.SetFutureAccessOrder(v, 0, order);
  ClairvoyantPolicy policy(plan);
  std::vector<uint64_t> live_soon = {fp(1), fp(2)}, live_late = {fp(3)}, dead = {fp(10), fp(11)};
  std::vector<SegmentSummary> segs = {{1, 5, &live_soon}, {2, 1, &live_late}, {3, 9, &dead}};
  // Forced: the segment without a planned use goes first, whatever its recency.
  CHECK(policy.PickVictim(segs, std::nullopt) == std::optional<uint32_t>(3));
  // Admission of a planned chunk may take the dead segment...
  CHECK(policy.PickVictim(segs, fp(4)) == std::optional<uint32_t>(3));
  // ...but an unplanned chunk is bypassed.
  CHECK_FALSE(policy.PickVictim(segs, fp(12)).has_value());
  // With only live segments, the furthest-needed one is the forced victim and admission is declined.
  std::vector<SegmentSummary> live = {{1, 5, &live_soon}, {2, 1, &live_late}};
  CHECK(policy.PickVictim(live, std::nullopt) == std::optional<uint32_t>(2));
  CHECK_FALSE(policy.PickVictim(live, fp(4)).has_value());
  CHECK(policy.AdmitIntoFreedSpace(fp(4)));
  CHECK_FALSE(policy.AdmitIntoFreedSpace(fp(12)));
}
