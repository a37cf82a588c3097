// shardctl index / pack / ls as an operator runs them: exit codes (0 ok, 1 failure, 2 usage)
// and messages that name the file and offset.
#include <catch2/catch.hpp>

#include <fcntl.h>

#include "common/fs.h"
#include "dataset/synthetic.h"
#include "testing/process.h"
#include "testing/temp_dir.h"

namespace shardcache::dataset {
namespace {

using shardcache::testing::BinPath;
using shardcache::testing::RunCommand;
using shardcache::testing::TempDir;

int Shardctl(const std::string& args, std::string* out) {
  out->clear();
  return RunCommand(BinPath("shardctl") + " " + args, out);
}

TEST_CASE("shardctl index, ls and ls --verify on a good records dataset", "[dataset][cli]") {
  TempDir tmp;
  REQUIRE(MakeDirs(tmp / "r").ok());
  REQUIRE(synthetic::WriteRecordsShard(tmp / "r/a.bin", synthetic::RecordKind::kRandom, 1, 0, 64,
                                       4096).ok());
  std::string out;
  REQUIRE(Shardctl("index " + (tmp / "r") + " --format records --record-bytes 4KiB "
                   "--chunk-bytes 64KiB --name recs", &out) == 0);
  CHECK_THAT(out, Catch::Contains("dataset 'recs'") && Catch::Contains("64 samples") &&
                      Catch::Contains("4 chunks"));
  REQUIRE(Shardctl("ls " + (tmp / "r"), &out) == 0);
  CHECK_THAT(out, Catch::Contains("recs") && Catch::Contains("a.bin") &&
                      Catch::Contains("262144"));
  REQUIRE(Shardctl("ls --verify " + (tmp / "r"), &out) == 0);
  CHECK_THAT(out, Catch::Contains("verified 4 chunks"));

  // Same size, one byte changed: ls loads, --verify fails naming the file.
  auto fd = OpenFile(tmp / "r/a.bin", O_RDWR);
  REQUIRE(fd.ok());
  REQUIRE(PwriteFull(fd->get(), "X", 1, 70000, tmp / "r/a.bin").ok());
  CHECK(Shardctl("ls " + (tmp / "r"), &out) == 0);
  CHECK(Shardctl("ls --verify " + (tmp / "r"), &out) == 1);
  CHECK_THAT(out, Catch::Contains("a.bin") && Catch::Contains("chunk 1") &&
                      Catch::Contains("65536"));
}

TEST_CASE("shardctl exit codes: 2 for usage, 1 for bad data", "[dataset][cli]") {
  TempDir tmp;
  REQUIRE(MakeDirs(tmp / "r").ok());
  REQUIRE(WriteFileAtomic(tmp / "r/odd.bin", std::string(10000, 'x')).ok());
  std::string out;
  CHECK(Shardctl("index " + (tmp / "r") + " --format records", &out) == 2);
  CHECK_THAT(out, Catch::Contains("--record-bytes"));
  CHECK(Shardctl("index " + (tmp / "r") + " --format parquet", &out) == 2);
  CHECK_THAT(out, Catch::Contains("parquet"));
  CHECK(Shardctl("index " + (tmp / "r") + " --format records --record-bytes 4XB", &out) == 2);
  CHECK(Shardctl("index " + (tmp / "r"), &out) == 2);  // --format is required
  CHECK(Shardctl("index " + (tmp / "r") + " --format records --record-bytes 4096 --bogus", &out) == 2);

  CHECK(Shardctl("index " + (tmp / "r") + " --format records --record-bytes 4096", &out) == 1);
  CHECK_THAT(out, Catch::Contains("odd.bin") && Catch::Contains("10000") &&
                      Catch::Contains("not a multiple"));
  CHECK(Shardctl("index " + (tmp / "missing") + " --format tar", &out) == 1);
  CHECK(Shardctl("ls " + (tmp / "r"), &out) == 1);
  CHECK_THAT(out, Catch::Contains("manifest.pb"));
}

TEST_CASE("shardctl index names the file and offset of a corrupt tar header", "[dataset][cli]") {
  TempDir tmp;
  REQUIRE(MakeDirs(tmp / "t").ok());
  REQUIRE(synthetic::WriteTarShard(tmp / "t/s.tar", 1, 0, 5, 600, 600).ok());
  // Samples are 512 (jpg header) + 1024 (600 bytes padded) + 512 + 512: the third sample's
  // first header is at 2 * 2560.
  auto fd = OpenFile(tmp / "t/s.tar", O_RDWR);
  REQUIRE(fd.ok());
  REQUIRE(PwriteFull(fd->get(), "#", 1, 2 * 2560 + 3, tmp / "t/s.tar").ok());
  std::string out;
  CHECK(Shardctl("index " + (tmp / "t") + " --format tar", &out) == 1);
  CHECK_THAT(out, Catch::Contains("s.tar at offset 5120") && Catch::Contains("checksum"));
}

TEST_CASE("shardctl pack packs and indexes; refuses a non-empty output", "[dataset][cli]") {
  TempDir tmp;
  uint64_t bytes = 0;
  REQUIRE(synthetic::WriteFileTree(tmp / "src", 2, 200, 100, 2000, 4, &bytes).ok());
  std::string out;
  REQUIRE(Shardctl("pack " + (tmp / "src") + " " + (tmp / "out") + " --shard-bytes 64KiB", &out) == 0);
  CHECK_THAT(out, Catch::Contains("packed 200 files") && Catch::Contains("100 samples"));
  REQUIRE(Shardctl("ls --summary --verify " + (tmp / "out"), &out) == 0);
  CHECK_THAT(out, Catch::Contains("format   tar"));
  CHECK(Shardctl("pack " + (tmp / "src") + " " + (tmp / "out"), &out) == 1);
  CHECK_THAT(out, Catch::Contains("not empty"));
  CHECK(Shardctl("pack " + (tmp / "src") + " " + (tmp / "out2") + " --shard-bytes lots", &out) == 2);
}

}  // namespace
}  // namespace shardcache::dataset
