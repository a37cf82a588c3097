#include "dataset/tar_format.h"

#include <catch2/catch.hpp>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <sstream>

#include "common/fs.h"
#include "dataset/byte_source.h"
#include "dataset/tar_writer.h"
#include "testing/process.h"
#include "testing/temp_dir.h"

namespace shardcache::dataset {
namespace {

using shardcache::testing::RunCommand;
using shardcache::testing::TempDir;

// A raw ustar header block, for building archives GNU tar would not write.
std::string Header(const std::string& name, uint64_t size, char type = '0') {
  std::string h(512, '\0');
  std::memcpy(h.data(), name.data(), std::min<size_t>(name.size(), 100));
  std::snprintf(&h[100], 8, "%07o", 0644);
  std::snprintf(&h[108], 8, "%07o", 0);
  std::snprintf(&h[116], 8, "%07o", 0);
  std::snprintf(&h[124], 12, "%011llo", static_cast<unsigned long long>(size));
  std::snprintf(&h[136], 12, "%011o", 0);
  h[156] = type;
  std::memcpy(&h[257], "ustar\0" "00", 8);
  std::memset(&h[148], ' ', 8);
  unsigned sum = 0;
  for (unsigned char c : h) sum += c;
  std::snprintf(&h[148], 7, "%06o", sum);
  return h;
}

std::string Padded(std::string data) {
  data.resize((data.size() + 511) / 512 * 512, '\0');
  return data;
}

std::string PaxRecord(const std::string& key, const std::string& value) {
  const size_t body = key.size() + value.size() + 3;
  size_t len = body + 1;
  while (std::to_string(len).size() + body != len) len = std::to_string(len).size() + body;
  return std::to_string(len) + " " + key + "=" + value + "\n";
}

const std::string kEnd(1024, '\0');

Result<v1::SampleIndex> Parse(const std::string& tar) {
  MemoryByteSource src(tar, "test.tar");
  return IndexTarShard(src);
}

TEST_CASE("webdataset members sharing a key form one sample with exact member ranges",
          "[dataset][tar]") {
  const std::string tar = Header("a/x.jpg", 3) + Padded("JPG") + Header("a/x.cls", 1) +
                          Padded("7") + Header("a/y.seg.png", 600) + Padded(std::string(600, 'p')) +
                          kEnd;
  auto idx = Parse(tar);
  REQUIRE(idx.ok());
  REQUIRE(idx->offsets_size() == 2);
  CHECK(idx->keys(0) == "a/x");
  CHECK(idx->keys(1) == "a/y");
  CHECK(idx->offsets(0) == 0);
  CHECK(idx->lengths(0) == 2048);  // two headers + two padded data blocks
  CHECK(idx->offsets(1) == 2048);
  CHECK(idx->lengths(1) == 512 + 1024);
  REQUIRE(idx->member_offset_size() == 3);
  CHECK(idx->member_sample(1) == 0);
  CHECK(idx->member_offset(1) == 1536);
  CHECK(idx->member_length(1) == 1);
  CHECK(idx->member_ext(2) == "seg.png");
  CHECK(idx->member_sample(2) == 1);
  CHECK(tar.substr(idx->member_offset(0), idx->member_length(0)) == "JPG");
}

TEST_CASE("directories and files without an extension belong to no sample", "[dataset][tar]") {
  const std::string tar = Header("d/", 0, '5') + Header("d/README", 2) + Padded("hi") +
                          Header("d/k.txt", 2) + Padded("ok") + Header("d/.hidden", 1) +
                          Padded("h") + kEnd;
  auto idx = Parse(tar);
  REQUIRE(idx.ok());
  REQUIRE(idx->offsets_size() == 1);
  CHECK(idx->keys(0) == "d/k");
  CHECK(idx->offsets(0) == 512 * 3);
  CHECK(idx->member_offset_size() == 1);
}

TEST_CASE("a pax size record overrides the header size", "[dataset][tar]") {
  const std::string data(3000, 'z');
  const std::string pax = PaxRecord("size", "3000");
  // The ustar size field says 0, as writers do when the real size does not fit.
  const std::string tar = Header("PaxHeader", pax.size(), 'x') + Padded(pax) + Header("k.bin", 0) +
                          Padded(data) + kEnd;
  auto idx = Parse(tar);
  REQUIRE(idx.ok());
  REQUIRE(idx->member_length_size() == 1);
  CHECK(idx->member_length(0) == 3000);
  CHECK(idx->member_offset(0) == 1536);
  CHECK(idx->offsets(0) == 0);  // the sample starts at the pax header
  CHECK(idx->lengths(0) == 1536 + 3072);
}

TEST_CASE("a pax path record overrides the header name", "[dataset][tar]") {
  const std::string long_name = std::string(150, 'd') + "/" + std::string(120, 'n') + ".txt";
  const std::string pax = PaxRecord("path", long_name) + PaxRecord("mtime", "1.5");
  const std::string tar =
      Header("././@PaxHeader", pax.size(), 'x') + Padded(pax) + Header("truncated", 4) +
      Padded("data") + kEnd;
  auto idx = Parse(tar);
  REQUIRE(idx.ok());
  REQUIRE(idx->keys_size() == 1);
  CHECK(idx->keys(0) == long_name.substr(0, long_name.size() - 4));
  CHECK(idx->member_ext(0) == "txt");
}

TEST_CASE("a GNU base-256 size field is read", "[dataset][tar]") {
  std::string h = Header("big.bin", 0);
  std::memset(&h[124], 0, 12);
  h[124] = static_cast<char>(0x80);
  h[135] = 5;  // size 5
  std::memset(&h[148], ' ', 8);
  unsigned sum = 0;
  for (unsigned char c : h) sum += c;
  std::snprintf(&h[148], 7, "%06o", sum);
  auto idx = Parse(h + Padded("12345") + kEnd);
  REQUIRE(idx.ok());
  CHECK(idx->member_length(0) == 5);
}

TEST_CASE("damaged tar shards are DataLoss naming the file and offset", "[dataset][tar]") {
  const std::string good =
      Header("a.jpg", 700) + Padded(std::string(700, 'x')) + Header("b.jpg", 3) + Padded("abc") + kEnd;
  REQUIRE(Parse(good).ok());

  SECTION("bad header checksum") {
    std::string bad = good;
    bad[1536 + 5] ^= 0x20;  // a byte of b.jpg's name
    auto r = Parse(bad);
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == StatusCode::kDataLoss);
    CHECK_THAT(r.status().message(), Catch::Contains("test.tar at offset 1536") &&
                                         Catch::Contains("checksum"));
  }
  SECTION("truncated in the middle of member data") {
    auto r = Parse(good.substr(0, 900));
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == StatusCode::kDataLoss);
    CHECK_THAT(r.status().message(), Catch::Contains("test.tar at offset 0") &&
                                         Catch::Contains("'a.jpg'") && Catch::Contains("truncated"));
  }
  SECTION("truncated inside a header") {
    auto r = Parse(good.substr(0, 1536 + 100));
    REQUIRE_FALSE(r.ok());
    CHECK_THAT(r.status().message(), Catch::Contains("offset 1536") &&
                                         Catch::Contains("truncated tar header"));
  }
  SECTION("non-octal size field") {
    std::string bad = Header("a.jpg", 700);
    bad[126] = '9';
    std::memset(&bad[148], ' ', 8);
    unsigned sum = 0;
    for (unsigned char c : bad) sum += c;
    std::snprintf(&bad[148], 7, "%06o", sum);
    auto r = Parse(bad + good.substr(512));
    REQUIRE_FALSE(r.ok());
    CHECK_THAT(r.status().message(), Catch::Contains("size field"));
  }
  SECTION("random bytes are not a tar") {
    auto r = Parse(std::string(4096, 'Q'));
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == StatusCode::kDataLoss);
  }
  SECTION("a pax header claiming a huge size is refused without allocating it") {
    std::string h = Header("p", 0, 'x');
    std::snprintf(&h[124], 12, "%011llo", 077777777777ull);
    std::memset(&h[148], ' ', 8);
    unsigned sum = 0;
    for (unsigned char c : h) sum += c;
    std::snprintf(&h[148], 7, "%06o", sum);
    auto r = Parse(h + kEnd);
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == StatusCode::kDataLoss);
  }
  SECTION("a malformed pax record") {
    const std::string pax = "99 path=x\n";
    auto r = Parse(Header("p", pax.size(), 'x') + Padded(pax) + good);
    REQUIRE_FALSE(r.ok());
    CHECK_THAT(r.status().message(), Catch::Contains("offset 512") && Catch::Contains("pax"));
  }
}

TEST_CASE("a sample member whose name is not valid UTF-8 is refused naming its offset",
          "[dataset][tar]") {
  auto r = Parse(Header("ok.jpg", 1) + Padded("a") + Header("bad\xff.jpg", 1) + Padded("b") + kEnd);
  REQUIRE_FALSE(r.ok());
  CHECK_THAT(r.status().message(), Catch::Contains("offset 1024") && Catch::Contains("UTF-8"));
}

TEST_CASE("an archive without end blocks that ends on a member boundary is accepted",
          "[dataset][tar]") {
  auto idx = Parse(Header("a.jpg", 3) + Padded("abc"));
  REQUIRE(idx.ok());
  CHECK(idx->offsets_size() == 1);
}

struct GnuMember {
  uint64_t header_block;
  uint64_t size;
  std::string name;
};

// Parses `tar -R -tvf` lines: "block N: -rw-r--r-- user/group SIZE DATE TIME NAME".
std::vector<GnuMember> GnuListing(const std::string& out) {
  std::vector<GnuMember> members;
  std::istringstream in(out);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("block ", 0) != 0) continue;
    std::istringstream ls(line.substr(6));
    std::string block, perms, owner, date, time;
    GnuMember m{};
    ls >> block >> perms >> owner >> m.size >> date >> time;
    if (perms.empty() || perms[0] != '-') continue;  // regular files only
    std::getline(ls >> std::ws, m.name);
    m.header_block = std::stoull(block.substr(0, block.size() - 1));
    members.push_back(m);
  }
  return members;
}

TEST_CASE("member data offsets match GNU tar's for posix, gnu and ustar archives",
          "[dataset][tar][integration]") {
  TempDir tmp;
  const std::string src = tmp / "src";
  std::map<std::string, std::string> files = {
      {"a.jpg", std::string(1000, 'a')},
      {"a.cls", "3"},
      {"sub/b.jpg", std::string(513, 'b')},
      {"sub/b.json", "{}"},
      {"sub/c.jpg", ""},
      {std::string(120, 'L') + "/" + std::string(110, 'n') + ".txt", "long"},
  };
  for (const auto& [name, data] : files) {
    const std::string path = src + "/" + name;
    REQUIRE(MakeDirs(std::filesystem::path(path).parent_path().string()).ok());
    FILE* f = std::fopen(path.c_str(), "wb");
    REQUIRE(f != nullptr);
    std::fwrite(data.data(), 1, data.size(), f);
    std::fclose(f);
  }
  for (const std::string format : {"posix", "gnu", "ustar"}) {
    DYNAMIC_SECTION("format " << format) {
      const std::string tar = tmp / (format + ".tar");
      // ustar cannot hold the 230-character name; leave that file out of the ustar archive.
      const std::string members =
          format == "ustar" ? "a.cls a.jpg sub" : "a.cls a.jpg sub " + std::string(120, 'L');
      std::string out;
      REQUIRE(RunCommand("tar --sort=name --format=" + format + " -cf " + tar + " -C " + src + " " + members,
                         &out) == 0);
      REQUIRE(RunCommand("tar -R -tvf " + tar, &out) == 0);
      const std::vector<GnuMember> gnu = GnuListing(out);
      REQUIRE(gnu.size() == (format == "ustar" ? 5u : 6u));

      auto source = FileByteSource::Open(tar);
      REQUIRE(source.ok());
      auto idx = IndexTarShard(**source);
      REQUIRE(idx.ok());
      REQUIRE(static_cast<size_t>(idx->member_offset_size()) == gnu.size());
      auto bytes = ReadFileToString(tar);
      REQUIRE(bytes.ok());
      for (size_t i = 0; i < gnu.size(); ++i) {
        INFO("member " << gnu[i].name);
        // GNU tar -R reports a GNU long-name member at its 'L' block, which (with the name
        // and its NUL padded to blocks) precedes the real header; pax headers it skips itself.
        uint64_t header_block = gnu[i].header_block;
        if (format == "gnu" && gnu[i].name.size() > 100) header_block += 1 + (gnu[i].name.size() + 1 + 511) / 512;
        CHECK(idx->member_offset(static_cast<int>(i)) == (header_block + 1) * 512);
        CHECK(idx->member_length(static_cast<int>(i)) == gnu[i].size);
        CHECK(bytes->substr(idx->member_offset(static_cast<int>(i)),
                            idx->member_length(static_cast<int>(i))) == files.at(gnu[i].name));
      }
      // a.cls + a.jpg, sub/b.jpg + sub/b.json, sub/c.jpg (+ the long one).
      CHECK(idx->offsets_size() == (format == "ustar" ? 3 : 4));
      CHECK(idx->keys(0) == "a");
      CHECK(idx->keys(1) == "sub/b");
    }
  }
}

TEST_CASE("each sample's byte range is itself a tar stream GNU tar can list",
          "[dataset][tar][integration]") {
  TempDir tmp;
  auto w = TarWriter::Create(tmp / "s.tar");
  REQUIRE(w.ok());
  const std::string long_key = std::string(200, 'k');
  REQUIRE((*w)->AddBytes("one.jpg", "J1").ok());
  REQUIRE((*w)->AddBytes("one.cls", "1").ok());
  REQUIRE((*w)->AddBytes(long_key + ".jpg", std::string(5000, 'j')).ok());
  REQUIRE((*w)->AddBytes(long_key + ".cls", "2").ok());
  REQUIRE((*w)->Finish().ok());
  auto bytes = ReadFileToString(tmp / "s.tar");
  REQUIRE(bytes.ok());
  auto idx = Parse(*bytes);
  REQUIRE(idx.ok());
  REQUIRE(idx->offsets_size() == 2);
  CHECK(idx->keys(1) == long_key);
  const std::string piece = bytes->substr(idx->offsets(1), idx->lengths(1)) + kEnd;
  FILE* f = std::fopen((tmp / "piece.tar").c_str(), "wb");
  std::fwrite(piece.data(), 1, piece.size(), f);
  std::fclose(f);
  std::string out;
  REQUIRE(RunCommand("tar -tf " + (tmp / "piece.tar"), &out) == 0);
  CHECK(out == long_key + ".jpg\n" + long_key + ".cls\n");
}

TEST_CASE("WebDataset keys split at the first dot of the basename", "[dataset][tar]") {
  std::string key, ext;
  CHECK(SplitWebDatasetKey("dir.v2/img.seg.png", &key, &ext));
  CHECK(key == "dir.v2/img");
  CHECK(ext == "seg.png");
  CHECK_FALSE(SplitWebDatasetKey("dir.v2/README", &key, &ext));
  CHECK_FALSE(SplitWebDatasetKey(".hidden", &key, &ext));
}

}  // namespace
}  // namespace shardcache::dataset
