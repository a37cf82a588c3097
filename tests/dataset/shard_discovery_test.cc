// Shard discovery on a flat list of paths, as a bucket listing gives it: the same shards a
// directory walk picks (indexer_test covers the walk), nested datasets and .shardcache/ left out.
#include "dataset/shard_discovery.h"

#include <catch2/catch.hpp>

namespace shardcache::dataset {
namespace {

std::vector<std::string> Paths(const std::vector<ShardEntry>& shards) {
  std::vector<std::string> out;
  for (const auto& s : shards) out.push_back(s.path);
  return out;
}

TEST_CASE("SelectShards skips the dataset's .shardcache and datasets of their own, and sorts by path",
          "[dataset][discovery]") {
  std::vector<ListedFile> files = {
      {"b/y.bin", 10},
      {".shardcache/manifest.pb", 5},
      {".shardcache/samples/0.pb", 5},
      {"a.bin", 20},
      {"sub/.shardcache/manifest.pb", 5},
      {"sub/z.bin", 7},
      {"sub/deeper/w.bin", 7},
      {"subway/v.bin", 3},  // "sub" is a dataset, "subway" is not
      {"x.shardcache/u.bin", 4},
  };
  auto shards = SelectShards(files, v1::RECORDS, "s3://b/p/d");
  REQUIRE(shards.ok());
  CHECK(Paths(*shards) == std::vector<std::string>{"a.bin", "b/y.bin", "subway/v.bin", "x.shardcache/u.bin"});
  CHECK((*shards)[0].size_bytes == 20);
}

TEST_CASE("SelectShards applies each format's rule and names what is wrong", "[dataset][discovery]") {
  auto tar = SelectShards({{"s1.tar", 1024}, {"notes.txt", 3}, {"s0.tar", 2048}}, v1::TAR, "ROOT");
  REQUIRE(tar.ok());
  CHECK(Paths(*tar) == std::vector<std::string>{"s0.tar", "s1.tar"});

  auto gz = SelectShards({{"s0.tar", 1024}, {"s1.tar.gz", 99}}, v1::TAR, "ROOT");
  CHECK(gz.status().code() == StatusCode::kInvalidArgument);
  CHECK_THAT(gz.status().message(), Catch::Contains("ROOT/s1.tar.gz") && Catch::Contains("gzip-compressed"));

  auto meg = SelectShards({{"p0.bin", 64}, {"p0.idx", 40}, {"p1.bin", 64}}, v1::MEGATRON, "ROOT");
  CHECK(meg.status().code() == StatusCode::kNotFound);
  CHECK_THAT(meg.status().message(), Catch::Contains("ROOT/p1.bin") && Catch::Contains("ROOT/p1.idx"));
  auto meg_ok = SelectShards({{"p0.bin", 64}, {"p0.idx", 40}}, v1::MEGATRON, "ROOT");
  REQUIRE(meg_ok.ok());
  CHECK((*meg_ok)[0].companion_path == "p0.idx");

  auto none = SelectShards({{"readme.md", 3}}, v1::TAR, "s3://b/p/d");
  CHECK(none.status().code() == StatusCode::kNotFound);
  CHECK(none.status().message() == "s3://b/p/d: no tar shard files found");

  auto bad = SelectShards({{std::string("bad\xff.bin"), 3}}, v1::RECORDS, "ROOT");
  CHECK(bad.status().code() == StatusCode::kInvalidArgument);
  CHECK_THAT(bad.status().message(), Catch::Contains("UTF-8"));
}

}  // namespace
}  // namespace shardcache::dataset
