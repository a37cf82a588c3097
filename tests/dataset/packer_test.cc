#include "dataset/packer.h"

#include <catch2/catch.hpp>

#include <filesystem>
#include <map>
#include <set>
#include <sstream>
#include <vector>

#include "common/fs.h"
#include "dataset/synthetic.h"
#include "testing/process.h"
#include "testing/temp_dir.h"

namespace shardcache::dataset {
namespace {

namespace fs = std::filesystem;
using shardcache::testing::RunCommand;
using shardcache::testing::TempDir;

std::map<std::string, std::string> ReadTree(const std::string& root) {
  std::map<std::string, std::string> files;
  for (auto& e : fs::recursive_directory_iterator(root)) {
    if (!e.is_regular_file()) continue;
    if (e.path().string().find("/.shardcache/") != std::string::npos) continue;
    auto data = ReadFileToString(e.path().string());
    REQUIRE(data.ok());
    files[e.path().lexically_relative(root).generic_string()] = *data;
  }
  return files;
}

TEST_CASE("member names map back to exactly one source path", "[dataset][pack]") {
  for (const std::string p : {"a.jpg", "dir/x.seg.png", ".hidden", ".hidden.txt", "a.", "a",
                              "50%/b.c", "v1.2/img.jpg", "x/%2F.y", "lat\xe9n1/\xff.t\xfe",
                              "\xc3\xa9t\xc3\xa9.jpg"}) {
    const std::string member = PackedMemberName(p);
    INFO(p << " -> " << member);
    CHECK(member.find('/') == std::string::npos);
    CHECK(member.substr(0, member.find('.')).find('.') == std::string::npos);
    auto back = DecodePackedName(member);
    REQUIRE(back.ok());
    CHECK(*back == p);
  }
  CHECK(PackedMemberName("a") != PackedMemberName("a."));
  CHECK(PackedMemberName("d/x.jpg") == "d%2Fx.jpg");
  CHECK(PackedMemberName("\xc3\xa9t\xc3\xa9.jpg") == "\xc3\xa9t\xc3\xa9.jpg");  // valid UTF-8 kept
  CHECK(PackedMemberName("a\xff.b\xfe") == "a%FF.b%FE");
}

TEST_CASE("pack writes tar shards GNU tar lists and extracts byte-identically",
          "[dataset][pack][integration]") {
  TempDir tmp;
  uint64_t bytes = 0;
  REQUIRE(synthetic::WriteFileTree(tmp / "src", 5, 600, 100, 9000, 7, &bytes).ok());
  // Odd names too: no extension, hidden, dots in directories, a long path.
  const std::string long_dir = std::string(90, 'd') + "/" + std::string(90, 'e');
  const std::vector<std::string> odd = {"README", ".hidden", "v1.2/notes.txt", "v1.2/notes.md",
                                       "raw\xff.bin", "caf\xc3\xa9/\xe2\x82\xac.txt",
                                       long_dir + "/" + std::string(60, 'f') + ".bin"};
  for (const std::string& name : odd) {
    REQUIRE(MakeDirs(fs::path(tmp / ("src/" + name)).parent_path().string()).ok());
    REQUIRE(WriteFileAtomic(tmp / ("src/" + name), "content of " + name).ok());
  }
  PackOptions o;
  o.shard_bytes = 256 << 10;
  o.chunk_bytes = 64 << 10;
  uint64_t pack_done = 0, pack_total = 0;
  o.progress = [&](const char* phase, uint64_t done, uint64_t total) {
    if (std::string(phase) == "pack") {
      pack_done = done;
      pack_total = total;
    }
  };
  auto r = PackDirectory(tmp / "src", tmp / "out", o);
  REQUIRE(r.ok());
  CHECK(r->files == 607);
  CHECK(pack_done == pack_total);
  CHECK(pack_total == r->file_bytes);
  const v1::Manifest& m = r->dataset->manifest;
  CHECK(m.format() == v1::TAR);
  CHECK(m.name() == "out");
  CHECK(m.shards_size() > 3);
  // 300 jpg/cls pairs, README, .hidden, notes.{txt,md} as one sample, raw, euro, the long one.
  CHECK(m.total_samples() == 306);

  std::set<std::string> keys_seen;
  std::string listing;
  for (int i = 0; i < m.shards_size(); ++i) {
    const std::string shard = tmp / ("out/" + m.shards(i).path());
    CHECK(m.shards(i).size_bytes() <= (256 << 10) + 16384);
    std::string out;
    REQUIRE(RunCommand("tar -tvf " + shard, &out) == 0);
    listing += out;
    // A sample never spans two shards.
    auto idx = LoadSampleIndex(tmp / "out", m, static_cast<uint32_t>(i));
    REQUIRE(idx.ok());
    for (const auto& k : idx->keys()) CHECK(keys_seen.insert(k).second);
    REQUIRE(MakeDirs(tmp / "x").ok());
    REQUIRE(RunCommand("tar -xf " + shard + " -C " + (tmp / "x"), &out) == 0);
  }
  std::istringstream lines(listing);
  std::string line;
  int members = 0;
  while (std::getline(lines, line)) ++members;
  CHECK(members == 607);

  const auto source = ReadTree(tmp / "src");
  const auto extracted = ReadTree(tmp / "x");
  REQUIRE(extracted.size() == source.size());
  for (const auto& [member, data] : extracted) {
    auto path = DecodePackedName(member);
    REQUIRE(path.ok());
    INFO(member << " -> " << *path);
    REQUIRE(source.count(*path) == 1);
    CHECK(source.at(*path) == data);
  }
}

TEST_CASE("pack refuses unsafe output directories", "[dataset][pack]") {
  TempDir tmp;
  REQUIRE(MakeDirs(tmp / "src").ok());
  REQUIRE(WriteFileAtomic(tmp / "src/a.txt", "a").ok());
  PackOptions o;
  SECTION("a non-empty output directory") {
    REQUIRE(MakeDirs(tmp / "out").ok());
    REQUIRE(WriteFileAtomic(tmp / "out/old.tar", "x").ok());
    auto r = PackDirectory(tmp / "src", tmp / "out", o);
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == StatusCode::kFailedPrecondition);
    CHECK_THAT(r.status().message(), Catch::Contains("not empty"));
  }
  SECTION("an output inside the source") {
    auto r = PackDirectory(tmp / "src", tmp / "src/packed", o);
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == StatusCode::kInvalidArgument);
  }
  SECTION("a missing source") {
    CHECK(PackDirectory(tmp / "nope", tmp / "out2", o).status().code() == StatusCode::kNotFound);
  }
}

}  // namespace
}  // namespace shardcache::dataset
