#include <catch2/catch.hpp>

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
  CHECK(clair.HitRatioAfterFirst() >= stat.HitRatioAfterFirst());
  CHECK(stat.HitRatioAfterFirst() > lru.HitRatioAfterFirst());
  // Static keeps (about) the half of the dataset it filled first.
  CHECK(stat.HitRatioAfterFirst() > 0.4);
}
