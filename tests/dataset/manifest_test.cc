#include "dataset/manifest.h"

#include <catch2/catch.hpp>

#include <fcntl.h>
#include <unistd.h>

#include "common/fs.h"
#include "dataset/indexer.h"
#include "dataset/verifier.h"
#include "testing/datasets.h"
#include "testing/temp_dir.h"

namespace shardcache::dataset {
namespace {

using shardcache::testing::TempDir;

void OverwriteByte(const std::string& path, uint64_t offset) {
  auto fd = OpenFile(path, O_RDWR);
  REQUIRE(fd.ok());
  char c = 0;
  REQUIRE(PreadFull(fd->get(), &c, 1, offset, path).ok());
  c ^= 0x5A;
  REQUIRE(PwriteFull(fd->get(), &c, 1, offset, path).ok());
}

TEST_CASE("a manifest round-trips: written, loaded, same version", "[dataset][manifest]") {
  TempDir tmp;
  auto made = shardcache::testing::MakeRecordsDataset(tmp.path(), "rt", 2, 50, 512, 8192, 3);
  REQUIRE(made.ok());
  auto loaded = LoadDatasetDir(tmp / "rt");
  REQUIRE(loaded.ok());
  CHECK((*loaded)->version == (*made)->version);
  CHECK((*loaded)->manifest_bytes == (*made)->manifest_bytes);
  CHECK((*loaded)->version == ManifestVersion((*loaded)->manifest_bytes));
  CHECK((*loaded)->version.size() == 32);

  SECTION("re-indexing unchanged files gives the same version") {
    IndexOptions o;
    o.name = "rt";
    o.record_bytes = 512;
    o.chunk_bytes = 8192;
    o.threads = 1;
    auto again = IndexDirectory(tmp / "rt", o);
    REQUIRE(again.ok());
    CHECK((*again)->version == (*made)->version);
  }
  SECTION("a different chunk size gives a different version") {
    IndexOptions o;
    o.name = "rt";
    o.record_bytes = 512;
    o.chunk_bytes = 4096;
    auto again = IndexDirectory(tmp / "rt", o);
    REQUIRE(again.ok());
    CHECK((*again)->version != (*made)->version);
  }
}

TEST_CASE("a shard file that no longer matches the manifest is reported with its name",
          "[dataset][manifest]") {
  TempDir tmp;
  REQUIRE(shardcache::testing::MakeRecordsDataset(tmp.path(), "m", 2, 40, 1024, 8192).ok());
  const std::string shard = tmp / "m/shard-00001.bin";

  SECTION("a shard with another size fails LoadDatasetDir") {
    REQUIRE(::truncate(shard.c_str(), 1000) == 0);
    auto r = LoadDatasetDir(tmp / "m");
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == StatusCode::kFailedPrecondition);
    CHECK_THAT(r.status().message(), Catch::Contains("shard-00001.bin") &&
                                         Catch::Contains("1000 bytes") &&
                                         Catch::Contains("40960"));
  }
  SECTION("a missing shard fails LoadDatasetDir") {
    REQUIRE(::unlink(shard.c_str()) == 0);
    auto r = LoadDatasetDir(tmp / "m");
    REQUIRE_FALSE(r.ok());
    CHECK_THAT(r.status().message(), Catch::Contains("shard-00001.bin") && Catch::Contains("missing"));
  }
  SECTION("a changed byte fails verification naming the file and the chunk's offset") {
    OverwriteByte(shard, 20000);  // chunk 2 of 8 KiB chunks
    auto d = LoadDatasetDir(tmp / "m");
    REQUIRE(d.ok());  // sizes still match
    Status s = VerifyDatasetDir(tmp / "m", **d);
    REQUIRE_FALSE(s.ok());
    CHECK(s.code() == StatusCode::kDataLoss);
    CHECK_THAT(s.message(), Catch::Contains("shard-00001.bin") && Catch::Contains("chunk 2") &&
                                Catch::Contains("16384"));
  }
  SECTION("an untouched dataset verifies") {
    auto d = LoadDatasetDir(tmp / "m");
    REQUIRE(d.ok());
    uint64_t last_done = 0, last_total = 0;
    VerifyOptions vo;
    vo.progress = [&](uint64_t done, uint64_t total) {
      last_done = done;
      last_total = total;
    };
    CHECK(VerifyDatasetDir(tmp / "m", **d, vo).ok());
    CHECK(last_done == 81920);
    CHECK(last_total == 81920);
  }
  SECTION("a tampered sample index is DataLoss") {
    auto d = LoadDatasetDir(tmp / "m");
    REQUIRE(d.ok());
    OverwriteByte(SampleIndexPath(tmp / "m", 0), 3);
    auto r = LoadSampleIndex(tmp / "m", (*d)->manifest, 0);
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == StatusCode::kDataLoss);
  }
  SECTION("a format-1 manifest (flat chunk hashes) is refused with what to run") {
    auto d = LoadDatasetDir(tmp / "m");
    REQUIRE(d.ok());
    v1::Manifest old = (*d)->manifest;
    old.set_format_version(1);
    old.clear_block_bytes();
    REQUIRE(WriteFileAtomic(ManifestPath(tmp / "m"), old.SerializeAsString()).ok());
    auto r = LoadDatasetDir(tmp / "m");
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == StatusCode::kFailedPrecondition);
    CHECK_THAT(r.status().message(), Catch::Contains("manifest.pb") && Catch::Contains("format version 1") &&
                                         Catch::Contains("shardctl index"));
  }
  SECTION("a manifest with another block size is refused naming it") {
    auto d = LoadDatasetDir(tmp / "m");
    REQUIRE(d.ok());
    v1::Manifest odd = (*d)->manifest;
    odd.set_block_bytes(65536);
    REQUIRE(WriteFileAtomic(ManifestPath(tmp / "m"), odd.SerializeAsString()).ok());
    auto r = LoadDatasetDir(tmp / "m");
    REQUIRE_FALSE(r.ok());
    CHECK_THAT(r.status().message(), Catch::Contains("block_bytes 65536"));
  }
  SECTION("a corrupt manifest file is DataLoss naming it") {
    REQUIRE(WriteFileAtomic(ManifestPath(tmp / "m"), std::string("\xff\xff\xff garbage", 11)).ok());
    auto r = LoadDatasetDir(tmp / "m");
    REQUIRE_FALSE(r.ok());
    CHECK_THAT(r.status().message(), Catch::Contains("manifest.pb"));
  }
}

}  // namespace
}  // namespace shardcache::dataset
