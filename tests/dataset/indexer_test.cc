#include "dataset/indexer.h"

#include <unistd.h>

#include <catch2/catch.hpp>

#include "common/fs.h"
#include "dataset/synthetic.h"
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
    CHECK(ChunkHash(m, 1, c) == ChunkDigest(bytes->data() + off, ChunkLength(m, 1, c)));
  }
  auto idx = LoadSampleIndex(tmp / "recs", m, 2);
  REQUIRE(idx.ok());
  CHECK(idx->offsets_size() == 100);
  CHECK(idx->offsets(5) == 5000);
  CHECK(idx->lengths(5) == 1000);
}

TEST_CASE("the indexer stores every chunk's block table at its stride; a re-index with fewer shards drops the rest",
          "[dataset][indexer][blocks]") {
  TempDir tmp;
  auto d = shardcache::testing::MakeRecordsDataset(tmp.path(), "recs", 3, 100, 1000, 65536, 7);
  REQUIRE(d.ok());
  const v1::Manifest& m = (*d)->manifest;
  const uint64_t stride = BlockTableStride(m.chunk_bytes());
  CHECK(stride == 4 * kBlockHashBytes);
  for (uint32_t s = 0; s < 3; ++s) {
    auto shard = ReadFileToString(tmp / ("recs/" + m.shards(static_cast<int>(s)).path()));
    auto tables = ReadFileToString(BlockTablesPath(tmp / "recs", s));
    REQUIRE(shard.ok());
    REQUIRE(tables.ok());
    const uint64_t chunks = ChunkCount(m, s);
    // Full chunks at the stride, then the last chunk's (shorter) table: nothing more.
    CHECK(tables->size() == (chunks - 1) * stride + ChunkBlockCount(ChunkLength(m, s, chunks - 1)) * kBlockHashBytes);
    for (uint64_t c = 0; c < chunks; ++c) {
      const std::string want = BlockTable(shard->data() + c * m.chunk_bytes(), ChunkLength(m, s, c));
      CHECK(tables->substr(c * stride, want.size()) == want);
      CHECK(RootOfBlockTable(want) == ChunkHash(m, s, c));
    }
  }
  // Re-indexed with one shard fewer: the third shard's tables go with its sample index.
  REQUIRE(::unlink((tmp / ("recs/" + m.shards(2).path())).c_str()) == 0);
  IndexOptions o;
  o.format = v1::RECORDS;
  o.record_bytes = 1000;
  o.chunk_bytes = 65536;
  REQUIRE(IndexDirectory(tmp / "recs", o).ok());
  CHECK(::access(BlockTablesPath(tmp / "recs", 1).c_str(), F_OK) == 0);
  CHECK(::access(BlockTablesPath(tmp / "recs", 2).c_str(), F_OK) != 0);
  CHECK(::access(SampleIndexPath(tmp / "recs", 2).c_str(), F_OK) != 0);
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

namespace shardcache::dataset {
namespace {

void WriteFile(const std::string& path, const std::string& data) {
  REQUIRE(MakeDirs(path.substr(0, path.rfind('/'))).ok());
  REQUIRE(WriteFileAtomic(path, data).ok());
}

TEST_CASE("records shards are found recursively, sorted, outside .shardcache",
          "[dataset][indexer]") {
  TempDir tmp;
  const std::string dir = tmp / "ds";
  WriteFile(dir + "/b/2.bin", std::string(200, 'b'));
  WriteFile(dir + "/a.bin", std::string(100, 'a'));
  WriteFile(dir + "/b/10.bin", std::string(300, 'c'));
  IndexOptions o;
  o.record_bytes = 100;
  o.chunk_bytes = 4096;
  auto d = IndexDirectory(dir, o);
  REQUIRE(d.ok());
  const auto& m = (*d)->manifest;
  CHECK(m.name() == "ds");
  REQUIRE(m.shards_size() == 3);
  CHECK(m.shards(0).path() == "a.bin");
  CHECK(m.shards(1).path() == "b/10.bin");
  CHECK(m.shards(2).path() == "b/2.bin");
  // Indexing again must not pick up its own .shardcache files as shards.
  auto again = IndexDirectory(dir + "/", o);
  REQUIRE(again.ok());
  CHECK((*again)->manifest.shards_size() == 3);
  CHECK((*again)->version == (*d)->version);
}

TEST_CASE("a subdirectory that is a dataset of its own is left out of its parent's shards",
          "[dataset][indexer][names]") {
  TempDir tmp;
  auto train = shardcache::testing::MakeRecordsDataset(tmp / "laion", "train", 2, 8, 4096, 4096);
  REQUIRE(train.ok());
  REQUIRE(synthetic::WriteRecordsShard(tmp / "laion/extra.bin", synthetic::RecordKind::kRandom, 1, 0, 4,
                                       4096).ok());
  IndexOptions o;
  o.record_bytes = 4096;
  o.chunk_bytes = 4096;
  auto laion = IndexDirectory(tmp / "laion", o);
  REQUIRE(laion.ok());
  REQUIRE((*laion)->manifest.shards_size() == 1);
  CHECK((*laion)->manifest.shards(0).path() == "extra.bin");
  CHECK((*laion)->manifest.name() == "laion");
}

TEST_CASE("hashing reports progress up to the total and is identical on 1 or many threads",
          "[dataset][indexer]") {
  TempDir tmp;
  auto d = shardcache::testing::MakeRecordsDataset(tmp.path(), "p", 3, 64, 4096, 4096);
  REQUIRE(d.ok());
  IndexOptions o;
  o.name = "p";
  o.record_bytes = 4096;
  o.chunk_bytes = 4096;
  uint64_t calls = 0, last_done = 0, last_total = 0;
  o.progress = [&](uint64_t done, uint64_t total) {
    ++calls;
    CHECK(done >= last_done);
    last_done = done;
    last_total = total;
  };
  for (unsigned threads : {1u, 4u}) {
    o.threads = threads;
    auto r = IndexDirectory(tmp / "p", o);
    REQUIRE(r.ok());
    CHECK((*r)->version == (*d)->version);
    CHECK(last_done == 3 * 64 * 4096);
    CHECK(last_total == 3 * 64 * 4096);
    last_done = 0;
  }
  CHECK(calls >= 2);
}

TEST_CASE("indexing errors name what is wrong", "[dataset][indexer]") {
  TempDir tmp;
  IndexOptions o;
  SECTION("an empty directory has no shards") {
    REQUIRE(MakeDirs(tmp / "empty").ok());
    o.record_bytes = 8;
    auto r = IndexDirectory(tmp / "empty", o);
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == StatusCode::kNotFound);
  }
  SECTION("a megatron .bin without its .idx") {
    WriteFile(tmp / "meg/x.bin", "abcd");
    o.format = v1::MEGATRON;
    auto r = IndexDirectory(tmp / "meg", o);
    REQUIRE_FALSE(r.ok());
    CHECK_THAT(r.status().message(), Catch::Contains("x.bin") && Catch::Contains("x.idx"));
  }
  SECTION("a shard path that is not UTF-8 (manifest paths are proto3 strings)") {
    WriteFile(tmp / "u/ok.bin", "12345678");
    WriteFile(tmp / "u/bad\xff.bin", "12345678");
    o.record_bytes = 8;
    auto r = IndexDirectory(tmp / "u", o);
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == StatusCode::kInvalidArgument);
    CHECK_THAT(r.status().message(), Catch::Contains("UTF-8"));
  }
  SECTION("a chunk size out of bounds") {
    o.record_bytes = 8;
    o.chunk_bytes = 100;
    CHECK(IndexDirectory(tmp.path(), o).status().code() == StatusCode::kInvalidArgument);
  }
  SECTION("a corrupt tar shard fails the whole index and writes no manifest") {
    auto d = shardcache::testing::MakeTarDataset(tmp.path(), "t", 2, 10);
    REQUIRE(d.ok());
    REQUIRE(::unlink(ManifestPath(tmp / "t").c_str()) == 0);
    auto bytes = ReadFileToString(tmp / "t/shard-00001.tar");
    REQUIRE(bytes.ok());
    REQUIRE(WriteFileAtomic(tmp / "t/shard-00001.tar", bytes->substr(0, bytes->size() / 2 + 100)).ok());
    o.format = v1::TAR;
    auto r = IndexDirectory(tmp / "t", o);
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == StatusCode::kDataLoss);
    CHECK_THAT(r.status().message(), Catch::Contains("shard-00001.tar at offset"));
    CHECK_FALSE(LoadDatasetDir(tmp / "t").ok());
  }
}

TEST_CASE("the sample indexes of a generated tar dataset point at the generated bytes",
          "[dataset][indexer]") {
  TempDir tmp;
  auto d = shardcache::testing::MakeTarDataset(tmp.path(), "t", 2, 30, 100, 3000, 4096, 9);
  REQUIRE(d.ok());
  auto idx = LoadSampleIndex(tmp / "t", (*d)->manifest, 1);
  REQUIRE(idx.ok());
  REQUIRE(idx->offsets_size() == 30);
  auto bytes = ReadFileToString(tmp / "t/shard-00001.tar");
  REQUIRE(bytes.ok());
  for (int m = 0; m < idx->member_offset_size(); ++m) {
    const uint32_t sample = idx->member_sample(m);
    const std::string data = bytes->substr(idx->member_offset(m), idx->member_length(m));
    CHECK(idx->keys(static_cast<int>(sample)) == shardcache::testing::TarSampleKey(1, sample));
    if (idx->member_ext(m) == "jpg") {
      CHECK(data == shardcache::testing::TarJpgBytes(9, 1, sample, 100, 3000));
    } else {
      CHECK(data == std::to_string(sample % 1000));
    }
  }
}

}  // namespace
}  // namespace shardcache::dataset
