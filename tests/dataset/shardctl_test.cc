// shardctl index / pack / ls as an operator runs them: exit codes (0 ok, 1 failure, 2 usage)
// and messages that name the file and offset.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <unistd.h>

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
  REQUIRE(MakeDirs(tmp / "recs").ok());
  REQUIRE(synthetic::WriteRecordsShard(tmp / "recs/a.bin", synthetic::RecordKind::kRandom, 1, 0, 64,
                                       4096).ok());
  std::string out;
  REQUIRE(Shardctl("index " + (tmp / "recs") + " --format records --record-bytes 4KiB "
                   "--chunk-bytes 64KiB --name recs", &out) == 0);
  CHECK_THAT(out, Catch::Contains("dataset 'recs'") && Catch::Contains("64 samples") &&
                      Catch::Contains("4 chunks"));
  REQUIRE(Shardctl("ls " + (tmp / "recs"), &out) == 0);
  CHECK_THAT(out, Catch::Contains("recs") && Catch::Contains("a.bin") &&
                      Catch::Contains("262144"));
  REQUIRE(Shardctl("ls --verify " + (tmp / "recs"), &out) == 0);
  CHECK_THAT(out, Catch::Contains("verified 4 chunks"));

  // Same size, one byte changed: ls loads, --verify fails naming the file.
  auto fd = OpenFile(tmp / "recs/a.bin", O_RDWR);
  REQUIRE(fd.ok());
  REQUIRE(PwriteFull(fd->get(), "X", 1, 70000, tmp / "recs/a.bin").ok());
  CHECK(Shardctl("ls " + (tmp / "recs"), &out) == 0);
  CHECK(Shardctl("ls --verify " + (tmp / "recs"), &out) == 1);
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

TEST_CASE("shardctl index --name takes the directory's path below a root, and refuses a name no daemon would serve",
          "[dataset][cli][names]") {
  TempDir tmp;
  const std::string dir = tmp / "srv/laion/train";
  REQUIRE(MakeDirs(dir).ok());
  REQUIRE(synthetic::WriteRecordsShard(dir + "/a.bin", synthetic::RecordKind::kRandom, 1, 0, 8, 4096).ok());
  std::string out;
  // The bug this replaces: the manifest said 'bar', the daemon looked for 'train'.
  CHECK(Shardctl("index " + dir + " --format records --record-bytes 4KiB --name bar", &out) == 1);
  CHECK_THAT(out, Catch::Contains("--name 'bar' does not match directory " + dir) &&
                      Catch::Contains("'train' for upstream root " + (tmp / "srv/laion")) &&
                      Catch::Contains("'laion/train' for root " + (tmp / "srv")));
  CHECK(Shardctl("ls " + dir, &out) == 1);  // nothing was written
  CHECK(Shardctl("index " + dir + " --format records --record-bytes 4KiB --name ../x", &out) == 1);
  CHECK_THAT(out, Catch::Contains("'..'"));
  REQUIRE(Shardctl("index " + dir + " --format records --record-bytes 4KiB --name laion/train", &out) == 0);
  CHECK_THAT(out, Catch::Contains("dataset 'laion/train'"));
  REQUIRE(Shardctl("index " + dir + "/ --format records --record-bytes 4KiB", &out) == 0);
  CHECK_THAT(out, Catch::Contains("dataset 'train'"));
}

TEST_CASE("shardctl index refuses gzipped tar shards, naming the file and what to do", "[dataset][cli][tar]") {
  TempDir tmp;
  REQUIRE(MakeDirs(tmp / "t").ok());
  REQUIRE(synthetic::WriteTarShard(tmp / "t/a.tar", 1, 0, 5, 600, 600).ok());
  std::string out;
  for (const std::string gz : {"b.tar.gz", "c.tgz"}) {
    INFO(gz);
    REQUIRE(RunCommand("gzip -c " + (tmp / "t/a.tar") + " > " + (tmp / ("t/" + gz))) == 0);
    CHECK(Shardctl("index " + (tmp / "t") + " --format tar", &out) == 1);
    CHECK_THAT(out, Catch::Contains(tmp / ("t/" + gz)) && Catch::Contains("gunzip") &&
                        Catch::Contains("shardctl pack"));
    REQUIRE(::unlink((tmp / ("t/" + gz)).c_str()) == 0);
  }
  // A gzipped tar named .tar is recognised by its magic.
  REQUIRE(RunCommand("gzip -c " + (tmp / "t/a.tar") + " > " + (tmp / "t/d.tar")) == 0);
  CHECK(Shardctl("index " + (tmp / "t") + " --format tar", &out) == 1);
  CHECK_THAT(out, Catch::Contains(tmp / "t/d.tar") && Catch::Contains("gzip-compressed"));
}

TEST_CASE("shardctl pack shuffles samples with a seed by default; --no-shuffle and --shuffle-seed none keep path order",
          "[dataset][cli][pack]") {
  TempDir tmp;
  uint64_t bytes = 0;
  REQUIRE(synthetic::WriteFileTree(tmp / "src", 2, 40, 100, 200, 4, &bytes).ok());
  std::string out;
  REQUIRE(Shardctl("pack " + (tmp / "src") + " " + (tmp / "a"), &out) == 0);
  CHECK_THAT(out, Catch::Contains("20 samples shuffled with seed 0"));
  REQUIRE(Shardctl("pack " + (tmp / "src") + " " + (tmp / "b") + " --shuffle-seed 7", &out) == 0);
  CHECK_THAT(out, Catch::Contains("shuffled with seed 7"));
  REQUIRE(Shardctl("pack " + (tmp / "src") + " " + (tmp / "c") + " --no-shuffle", &out) == 0);
  CHECK_THAT(out, Catch::Contains("20 samples in path order"));
  REQUIRE(Shardctl("pack " + (tmp / "src") + " " + (tmp / "d") + " --shuffle-seed none", &out) == 0);
  CHECK_THAT(out, Catch::Contains("in path order"));
  CHECK(Shardctl("pack " + (tmp / "src") + " " + (tmp / "e") + " --shuffle-seed many", &out) == 2);
  CHECK_THAT(out, Catch::Contains("'many'"));
  CHECK(Shardctl("pack " + (tmp / "src") + " " + (tmp / "e") + " --no-shuffle --shuffle-seed 3", &out) == 2);
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
