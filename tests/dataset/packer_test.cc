#include "dataset/packer.h"

#include <catch2/catch.hpp>

#include <filesystem>
#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <vector>

#include "common/fs.h"
#include "dataset/synthetic.h"
#include "dataset/tar_format.h"
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

TEST_CASE("member names keep the path and escape only what would break WebDataset key grouping",
          "[dataset][pack]") {
  // tar -xf gives these back as they are.
  for (const std::string p : {"a.jpg", "dir/x.seg.png", "v1.2/img.jpg", "d/sub/000123.jpg", ".git/x.txt",
                              "\xc3\xa9t\xc3\xa9.jpg", "a b/c d.txt"}) {
    CHECK(PackedMemberName(p) == p);
  }
  CHECK(PackedMemberName(".hidden.txt") == "%2Ehidden.txt");  // an empty key is no sample
  CHECK(PackedMemberName("d/.hidden") == "d/%2Ehidden.");
  CHECK(PackedMemberName("README") == "README.");             // no extension: no sample
  CHECK(PackedMemberName("a.") == "a%2E.");
  CHECK(PackedMemberName("50%/b.c") == "50%25/b.c");          // so every member decodes to one path
  CHECK(PackedMemberName("a\xff.b\xfe") == "a%FF.b%FE");      // keys are proto3 strings
}

TEST_CASE("every member name is a sample member and maps back to exactly one source path",
          "[dataset][pack]") {
  std::set<std::string> members;
  for (const std::string p : {"a.jpg", "dir/x.seg.png", ".hidden", ".hidden.txt", "a.", "a", "a..",
                              "README", "README.", "50%/b.c", "v1.2/img.jpg", "x/%2F.y", "%2Ehidden",
                              "lat\xe9n1/\xff.t\xfe", "\xc3\xa9t\xc3\xa9.jpg", "..x.y"}) {
    const std::string member = PackedMemberName(p);
    INFO(p << " -> " << member);
    CHECK(members.insert(member).second);
    std::string key, ext;
    CHECK(SplitWebDatasetKey(member, &key, &ext));
    auto back = DecodePackedName(member);
    REQUIRE(back.ok());
    CHECK(*back == p);
  }
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

// The sample keys of a packed dataset, in shard and sample order.
std::vector<std::string> PackedKeys(const std::string& dir, const DatasetPtr& d) {
  std::vector<std::string> keys;
  for (int i = 0; i < d->manifest.shards_size(); ++i) {
    auto idx = LoadSampleIndex(dir, d->manifest, static_cast<uint32_t>(i));
    REQUIRE(idx.ok());
    keys.insert(keys.end(), idx->keys().begin(), idx->keys().end());
  }
  return keys;
}

TEST_CASE("tar -xf of a packed tree gives back the same files byte for byte", "[dataset][pack][integration]") {
  TempDir tmp;
  uint64_t bytes = 0;
  REQUIRE(synthetic::WriteFileTree(tmp / "src", 3, 200, 100, 3000, 5, &bytes).ok());
  // Dots in directory names, one sample of two files, UTF-8, and a path of 400 bytes whose
  // basename alone is past ustar's 100 (a pax header).
  const std::string deep = std::string(90, 'd') + "/" + std::string(90, 'e') + "/" + std::string(90, 'g') +
                           "/" + std::string(120, 'f') + ".bin";
  for (const std::string& name : {std::string("v1.2/notes.txt"), std::string("v1.2/notes.md"),
                                 std::string("caf\xc3\xa9/\xe2\x82\xac.txt"), deep}) {
    REQUIRE(MakeDirs(fs::path(tmp / ("src/" + name)).parent_path().string()).ok());
    REQUIRE(WriteFileAtomic(tmp / ("src/" + name), "content of " + name).ok());
  }
  PackOptions o;
  o.shard_bytes = 64 << 10;
  o.chunk_bytes = 64 << 10;
  auto r = PackDirectory(tmp / "src", tmp / "out", o);
  REQUIRE(r.ok());
  const v1::Manifest& m = r->dataset->manifest;
  REQUIRE(m.shards_size() > 3);
  CHECK(m.total_samples() == 100 + 3);  // jpg/cls pairs, notes.{txt,md}, the euro, the deep one
  REQUIRE(MakeDirs(tmp / "x").ok());
  for (int i = 0; i < m.shards_size(); ++i) {
    std::string out;
    INFO(out);
    REQUIRE(RunCommand("tar -xf " + (tmp / ("out/" + m.shards(i).path())) + " -C " + (tmp / "x"), &out) == 0);
  }
  const auto source = ReadTree(tmp / "src");
  const auto extracted = ReadTree(tmp / "x");
  CHECK(extracted.size() == source.size());
  CHECK(extracted == source);
  // The index groups the members the way tar laid them out: key = path up to the basename's
  // first '.', directory included.
  const auto keys = PackedKeys(tmp / "out", r->dataset);
  const std::set<std::string> key_set(keys.begin(), keys.end());
  CHECK(key_set.size() == keys.size());
  CHECK(key_set.count("train/class-000/img-00000000") == 1);
  CHECK(key_set.count("v1.2/notes") == 1);
  CHECK(key_set.count(deep.substr(0, deep.size() - 4)) == 1);
}

// Mean number of distinct classes (the directory of a train/class-NNN/img-N key) among
// consecutive runs of 32 keys.
double ClassesPer32(const std::vector<std::string>& keys) {
  double sum = 0;
  size_t runs = 0;
  for (size_t i = 0; i + 32 <= keys.size(); i += 32, ++runs) {
    std::set<std::string> classes;
    for (size_t j = i; j < i + 32; ++j) classes.insert(keys[j].substr(0, keys[j].rfind('/')));
    sum += static_cast<double>(classes.size());
  }
  return runs ? sum / static_cast<double>(runs) : 0;
}

TEST_CASE("pack shuffles the sample order with a seed: deterministic, and classes mix within a shard",
          "[dataset][pack]") {
  TempDir tmp;
  uint64_t bytes = 0;
  REQUIRE(synthetic::WriteFileTree(tmp / "src", 4, 1280, 100, 400, 10, &bytes).ok());  // 640 samples
  auto pack = [&](const std::string& out, std::optional<uint64_t> seed) {
    PackOptions o;
    o.shard_bytes = 64 << 10;
    o.chunk_bytes = 64 << 10;
    o.shuffle_seed = seed;
    auto r = PackDirectory(tmp / "src", tmp / out, o);
    REQUIRE(r.ok());
    std::string hashes;  // of every chunk of every shard: the shards' bytes
    for (const auto& shard : r->dataset->manifest.shards()) hashes += shard.chunk_hashes();
    return std::pair(hashes, PackedKeys(tmp / out, r->dataset));
  };
  const auto [path_bytes, path_order] = pack("plain", std::nullopt);
  const auto [default_bytes, by_default] = pack("default", kDefaultPackShuffleSeed);
  const auto [again_bytes, again] = pack("again", kDefaultPackShuffleSeed);
  const auto [other_bytes, other_seed] = pack("other", 12345);
  REQUIRE(path_order.size() == 640);
  CHECK(std::is_sorted(path_order.begin(), path_order.end()));
  CHECK(again == by_default);
  CHECK(again_bytes == default_bytes);  // byte-identical shards
  CHECK(other_seed != by_default);
  CHECK(other_bytes != default_bytes);
  CHECK(path_bytes != default_bytes);
  for (const auto* order : {&by_default, &other_seed}) {
    CHECK(std::set<std::string>(order->begin(), order->end()) ==
          std::set<std::string>(path_order.begin(), path_order.end()));
    CHECK(ClassesPer32(*order) > 8.5);
  }
  CHECK(ClassesPer32(path_order) < 2.5);
  PackOptions defaults;
  CHECK(defaults.shuffle_seed == kDefaultPackShuffleSeed);  // on unless asked otherwise
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
