#include <catch2/catch.hpp>

#include "daemon/cache/dram_cache.h"

using namespace shardcache;
using namespace shardcache::cache;

namespace {
ChunkPtr MakeChunk(size_t n, uint8_t fill) {
  auto c = std::make_shared<Chunk>();
  c->bytes = AlignedBuffer(n);
  std::fill(c->bytes.data(), c->bytes.data() + n, fill);
  c->hash = ChunkDigest(c->bytes.data(), n);
  return c;
}
}  // namespace

TEST_CASE("dram cache keeps within its byte budget, evicting least recently used", "[cache][dram]") {
  DramCache dram(3 * 4096);
  const auto v = VersionId("v1");
  for (uint64_t i = 0; i < 3; ++i) dram.Put(ChunkKey{v, 0, i}, MakeChunk(4096, uint8_t(i)));
  REQUIRE(dram.Get(ChunkKey{v, 0, 0}));  // 0 becomes most recent
  dram.Put(ChunkKey{v, 0, 3}, MakeChunk(4096, 3));
  CHECK(dram.used_bytes() == 3 * 4096);
  CHECK(dram.Get(ChunkKey{v, 0, 1}) == nullptr);  // the least recent went
  CHECK(dram.Get(ChunkKey{v, 0, 0}) != nullptr);
  CHECK(dram.Get(ChunkKey{v, 0, 3}) != nullptr);
  dram.SetBudget(4096);
  CHECK(dram.used_bytes() <= 4096);
  CHECK(dram.entries() == 1);
}

TEST_CASE("dram cache hands out the same shared bytes, with no copy", "[cache][dram]") {
  DramCache dram(1 << 20);
  auto c = MakeChunk(8192, 9);
  const ChunkKey k{VersionId("v"), 1, 2};
  dram.Put(k, c);
  CHECK(dram.Get(k).get() == c.get());
  dram.EraseVersion(VersionId("v"));
  CHECK(dram.Get(k) == nullptr);
  CHECK(dram.used_bytes() == 0);
}

TEST_CASE("dram cache does not keep a chunk larger than its budget", "[cache][dram]") {
  DramCache dram(4096);
  dram.Put(ChunkKey{VersionId("v"), 0, 0}, MakeChunk(8192, 1));
  CHECK(dram.entries() == 0);
}
