#include "dataset/indexer.h"

#include <catch2/catch.hpp>

#include "common/fs.h"
#include "testing/datasets.h"
#include "testing/temp_dir.h"

namespace shardcache::dataset {
namespace {

using shardcache::testing::TempDir;

TEST_CASE("a records dataset indexes into a manifest whose chunks hash the shard bytes",
          "[dataset][indexer]") {
  TempDir tmp;
  auto d = shardcache::testing::MakeRecordsDataset(tmp.path(), "recs", 3, 100, 1000, 16384, 7);
  REQUIRE(d.ok());
  const v1::Manifest& m = (*d)->manifest;
  CHECK(m.name() == "recs");
  CHECK(m.shards_size() == 3);
  CHECK(m.total_samples() == 300);
  CHECK(m.total_bytes() == 300000);
  CHECK(m.shards(1).path() == "shard-00001.bin");
  CHECK(ChunkCount(m, 0) == 7);  // 100000 / 16384 rounded up
  auto bytes = ReadFileToString(tmp / "recs/shard-00001.bin");
  REQUIRE(bytes.ok());
  CHECK(bytes->substr(3000, 1000) == shardcache::testing::RecordBytes(7, 1, 3, 1000));
  for (uint64_t c = 0; c < ChunkCount(m, 1); ++c) {
    const uint64_t off = c * m.chunk_bytes();
    CHECK(ChunkHash(m, 1, c) == HashBytes(bytes->substr(off, ChunkLength(m, 1, c))));
  }
  auto idx = LoadSampleIndex(tmp / "recs", m, 2);
  REQUIRE(idx.ok());
  CHECK(idx->offsets_size() == 100);
  CHECK(idx->offsets(5) == 5000);
  CHECK(idx->lengths(5) == 1000);
}

TEST_CASE("tar, token and megatron test datasets index", "[dataset][indexer]") {
  TempDir tmp;
  auto t = shardcache::testing::MakeTarDataset(tmp.path(), "tars", 2, 50);
  REQUIRE(t.ok());
  CHECK((*t)->manifest.total_samples() == 100);
  auto k = shardcache::testing::MakeTokenDataset(tmp.path(), "toks", 2, 64, 512);
  REQUIRE(k.ok());
  CHECK((*k)->manifest.record_bytes() == 1024);
  auto g = shardcache::testing::MakeMegatronDataset(tmp.path(), "meg", 2, 40);
  REQUIRE(g.ok());
  CHECK((*g)->manifest.total_samples() == 80);
  CHECK((*g)->manifest.megatron_dtype_bytes() == 2);
  CHECK((*g)->manifest.shards(0).companion_path() == "part-00000.idx");
}

}  // namespace
}  // namespace shardcache::dataset
