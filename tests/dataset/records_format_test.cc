#include "dataset/records_format.h"

#include <catch2/catch.hpp>

namespace shardcache::dataset {
namespace {

TEST_CASE("a records shard has one sample per fixed-size record", "[dataset][records]") {
  auto idx = IndexRecordsShard("r.bin", 12288, 4096);
  REQUIRE(idx.ok());
  REQUIRE(idx->offsets_size() == 3);
  CHECK(idx->offsets(2) == 8192);
  CHECK(idx->lengths(2) == 4096);
  auto empty = IndexRecordsShard("e.bin", 0, 4096);
  REQUIRE(empty.ok());
  CHECK(empty->offsets_size() == 0);
}

TEST_CASE("a records shard whose size is not a multiple of the record size is refused",
          "[dataset][records]") {
  auto r = IndexRecordsShard("data/r.bin", 10000, 4096);
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().code() == StatusCode::kInvalidArgument);
  CHECK_THAT(r.status().message(), Catch::Contains("data/r.bin") && Catch::Contains("10000") &&
                                       Catch::Contains("4096") && Catch::Contains("offset 8192"));
  CHECK_FALSE(IndexRecordsShard("r.bin", 10, 0).ok());
}

}  // namespace
}  // namespace shardcache::dataset
