// shardctl index / pack with a bucket (issue 19), as an operator runs them, against s3rver on
// loopback: a dataset's shards uploaded without an index are indexed in place into the same
// bytes a local copy's index has, and read back through ObjectSource verified; a tree packed
// into a bucket reads back byte-exact; a missing bucket, refused credentials, an empty prefix
// and a prefix already in use are named errors with a non-zero exit. ObjectByteSource, the
// ranged-read ByteSource the indexer parses tar shards through, is checked on its own.
#include <catch2/catch.hpp>

#include <filesystem>

#include "common/fs.h"
#include "daemon/upstream/object_source.h"
#include "dataset/object_byte_source.h"
#include "dataset/synthetic.h"
#include "objstore/test_servers.h"
#include "testing/datasets.h"
#include "testing/process.h"
#include "testing/temp_dir.h"

namespace shardcache::dataset {
namespace {

namespace fs = std::filesystem;
using shardcache::testing::BinPath;
using shardcache::testing::RunCommand;
using shardcache::testing::TempDir;

// shardctl with s3rver's endpoint and credentials as the daemon would find them (environment),
// the key id replaced by `key_id`.
int Shardctl(const objstore::testing::S3rver& s3, const std::string& args, std::string* out,
             const std::string& key_id = "S3RVER") {
  out->clear();
  return RunCommand("env -u AWS_PROFILE AWS_SHARED_CREDENTIALS_FILE=/nonexistent AWS_ACCESS_KEY_ID=" + key_id +
                        " AWS_SECRET_ACCESS_KEY=S3RVER " + BinPath("shardctl") + " " + args + " --endpoint " +
                        s3.endpoint(),
                    out);
}

std::unique_ptr<objstore::ObjectClient> Client(const objstore::testing::S3rver& s3, const std::string& uri) {
  objstore::ObjectStoreOptions o;
  o.endpoint = s3.endpoint();
  o.credentials = {"S3RVER", "S3RVER", "", ""};
  auto client = objstore::ObjectClient::Open(*objstore::ParseObjectUri(uri), o);
  REQUIRE(client.ok());
  return std::move(*client);
}

// Uploads the files below `dir` (not its .shardcache/) as client.uri()'s PREFIX/<relative path>.
void UploadShards(objstore::ObjectClient& client, const std::string& dir) {
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    const std::string rel = fs::relative(e.path(), dir).generic_string();
    if (!e.is_regular_file() || rel.rfind(kMetaDirName, 0) == 0) continue;
    auto bytes = ReadFileToString(e.path().string());
    REQUIRE(bytes.ok());
    REQUIRE(client.Put(client.uri().Key(rel), *bytes).ok());
  }
}

std::string GetObject(objstore::ObjectClient& client, const std::string& rel) {
  auto got = client.Get(client.uri().Key(rel));
  INFO(rel << ": " << got.status().ToString());
  REQUIRE(got.ok());
  return got->bytes;
}

// The bucket's .shardcache/ objects (manifest, sample indexes, block tables) equal the local
// directory's index files.
void RequireSameIndex(objstore::ObjectClient& client, const std::string& dir, int shards) {
  auto manifest = ReadFileToString(ManifestPath(dir));
  REQUIRE(manifest.ok());
  CHECK(GetObject(client, std::string(kMetaDirName) + "/manifest.pb") == *manifest);
  for (int i = 0; i < shards; ++i) {
    auto samples = ReadFileToString(SampleIndexPath(dir, static_cast<uint32_t>(i)));
    REQUIRE(samples.ok());
    CHECK(GetObject(client, std::string(kMetaDirName) + "/samples/" + std::to_string(i) + ".pb") == *samples);
    auto tables = ReadFileToString(BlockTablesPath(dir, static_cast<uint32_t>(i)));
    REQUIRE(tables.ok());
    CHECK(GetObject(client, BlockTablesRelPath(static_cast<uint32_t>(i))) == *tables);
  }
}

// Every chunk of every shard of dataset `name` read through ObjectSource (hash-verified on
// arrival) equals the shard files in `dir`.
void RequireReadsBack(const objstore::testing::S3rver& s3, const std::string& upstream, const std::string& name,
                      const std::string& dir) {
  objstore::ObjectStoreOptions o;
  o.endpoint = s3.endpoint();
  o.credentials = {"S3RVER", "S3RVER", "", ""};
  auto src = upstream::ObjectSource::Open(upstream, o);
  REQUIRE(src.ok());
  auto d = (*src)->OpenDataset(name);
  INFO(d.status().ToString());
  REQUIRE(d.ok());
  const v1::Manifest& m = (*d)->manifest;
  ReadOptions ro;
  ro.deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  for (uint32_t s = 0; s < static_cast<uint32_t>(m.shards_size()); ++s) {
    std::string bytes;
    Status st = (*src)->ReadChunks(*d, s, 0, ChunkCount(m, s), ro, [&](uint64_t, const ChunkPtr& c) {
      bytes.append(reinterpret_cast<const char*>(c->bytes.data()), c->bytes.size());
      return Status::Ok();
    });
    INFO(st.ToString());
    REQUIRE(st.ok());
    auto want = ReadFileToString(dir + "/" + m.shards(static_cast<int>(s)).path());
    REQUIRE(want.ok());
    CHECK(bytes == *want);
    CHECK((*src)->GetSampleIndex(*d, s).ok());
  }
}

TEST_CASE("shardctl index s3:// writes the index a local copy gets, and the bucket then serves every chunk verified",
          "[dataset][cli][objstore]") {
  TempDir tmp;
  objstore::testing::S3rver s3;
  std::string out;
  SECTION("records") {
    REQUIRE(shardcache::testing::MakeRecordsDataset(tmp / "local", "rec", 3, 40, 4096, 64 * 1024).ok());
    auto client = Client(s3, "s3://test-bucket/sets/rec");
    UploadShards(*client, tmp / "local/rec");
    const int rc =
        Shardctl(s3, "index s3://test-bucket/sets/rec --format records --record-bytes 4KiB --chunk-bytes 64KiB", &out);
    INFO(out);
    REQUIRE(rc == 0);
    CHECK_THAT(out, Catch::Contains("dataset 'rec'") && Catch::Contains("3 shards") &&
                        Catch::Contains("120 samples"));
    RequireSameIndex(*client, tmp / "local/rec", 3);
    RequireReadsBack(s3, "s3://test-bucket/sets", "rec", tmp / "local/rec");
    // warm finds the store through the same flags and environment.
    const int warm = Shardctl(s3, "warm --upstream s3://test-bucket/sets rec", &out);
    INFO(out);
    CHECK(warm == 0);
    CHECK_THAT(out, Catch::Contains("warmed 'rec'"));
    // A shard removed and the prefix indexed again: its sample index and block tables go too, as
    // in a directory.
    REQUIRE(client->Delete(client->uri().Key("shard-00002.bin")).ok());
    const int again =
        Shardctl(s3, "index s3://test-bucket/sets/rec --format records --record-bytes 4KiB --chunk-bytes 64KiB", &out);
    INFO(out);
    REQUIRE(again == 0);
    CHECK_THAT(out, Catch::Contains("2 shards"));
    auto left = client->List(client->uri().Key(std::string(kMetaDirName) + "/samples/"));
    REQUIRE(left.ok());
    std::vector<std::string> keys;
    for (const auto& o : *left) keys.push_back(o.key);
    CHECK(keys == std::vector<std::string>{"sets/rec/.shardcache/samples/0.pb", "sets/rec/.shardcache/samples/1.pb"});
    auto tables = client->List(client->uri().Key(std::string(kMetaDirName) + "/blocks/"));
    REQUIRE(tables.ok());
    keys.clear();
    for (const auto& o : *tables) keys.push_back(o.key);
    CHECK(keys == std::vector<std::string>{"sets/rec/.shardcache/blocks/0.bin", "sets/rec/.shardcache/blocks/1.bin"});
  }
  SECTION("tar, read through cached blocks, with --name naming two components") {
    REQUIRE(shardcache::testing::MakeTarDataset(tmp / "local/laion", "train", 2, 30, 1000, 20000, 16 * 1024).ok());
    REQUIRE(Shardctl(s3, "index " + (tmp / "local/laion/train") + " --format tar --chunk-bytes 16KiB --name laion/train",
                     &out) == 0);
    auto client = Client(s3, "s3://test-bucket/sets/laion/train");
    UploadShards(*client, tmp / "local/laion/train");
    const int rc = Shardctl(
        s3, "index s3://test-bucket/sets/laion/train --format tar --chunk-bytes 16KiB --name laion/train", &out);
    INFO(out);
    REQUIRE(rc == 0);
    RequireSameIndex(*client, tmp / "local/laion/train", 2);
    RequireReadsBack(s3, "s3://test-bucket/sets", "laion/train", tmp / "local/laion/train");
    // A name that is not the prefix's tail is refused before anything is read.
    CHECK(Shardctl(s3, "index s3://test-bucket/sets/laion/train --format tar --name other", &out) != 0);
    CHECK_THAT(out, Catch::Contains("--name 'other'"));
  }
  SECTION("megatron, each .bin with its .idx") {
    REQUIRE(shardcache::testing::MakeMegatronDataset(tmp / "local", "gpt", 2, 50, 16, 512, 8 * 1024).ok());
    auto client = Client(s3, "s3://test-bucket/sets/gpt");
    UploadShards(*client, tmp / "local/gpt");
    const int rc = Shardctl(s3, "index s3://test-bucket/sets/gpt --format megatron --chunk-bytes 8KiB", &out);
    INFO(out);
    REQUIRE(rc == 0);
    RequireSameIndex(*client, tmp / "local/gpt", 2);
    RequireReadsBack(s3, "s3://test-bucket/sets", "gpt", tmp / "local/gpt");
  }
}

TEST_CASE("shardctl pack into s3:// uploads shards and index that read back byte-exact; the prefix must be empty",
          "[dataset][cli][objstore][pack]") {
  TempDir tmp;
  objstore::testing::S3rver s3;
  uint64_t bytes = 0;
  REQUIRE(synthetic::WriteFileTree(tmp / "src", 3, 120, 100, 3000, 4, &bytes).ok());
  std::string out;
  // The same tree packed locally: the bucket must end up with exactly these shards and index.
  REQUIRE(Shardctl(s3, "pack " + (tmp / "src") + " " + (tmp / "local/p") + " --shard-bytes 64KiB --chunk-bytes 16KiB",
                   &out) == 0);
  const int rc = Shardctl(s3, "pack " + (tmp / "src") + " s3://test-bucket/packs/p --shard-bytes 64KiB "
                                  "--chunk-bytes 16KiB --staging-dir " + tmp.path(),
                          &out);
  INFO(out);
  REQUIRE(rc == 0);
  CHECK_THAT(out, Catch::Contains("packed 120 files") && Catch::Contains("s3://test-bucket/packs/p"));
  auto local = LoadDatasetDir(tmp / "local/p");
  REQUIRE(local.ok());
  auto client = Client(s3, "s3://test-bucket/packs/p");
  RequireSameIndex(*client, tmp / "local/p", (*local)->manifest.shards_size());
  RequireReadsBack(s3, "s3://test-bucket/packs", "p", tmp / "local/p");
  // The staging directory is gone.
  for (const auto& e : fs::directory_iterator(tmp.path())) CHECK(e.path().filename().string().rfind("shardctl-pack-", 0) != 0);

  CHECK(Shardctl(s3, "pack " + (tmp / "src") + " s3://test-bucket/packs/p", &out) == 1);
  CHECK_THAT(out, Catch::Contains("s3://test-bucket/packs/p/") && Catch::Contains("already holds"));
}

TEST_CASE("shardctl index and pack with a bucket name what is wrong: bucket, credentials, prefix",
          "[dataset][cli][objstore]") {
  TempDir tmp;
  objstore::testing::S3rver s3;
  REQUIRE(MakeDirs(tmp / "src").ok());
  REQUIRE(WriteFileAtomic(tmp / "src/a.bin", std::string(8192, 'a')).ok());
  auto client = Client(s3, "s3://test-bucket/sets/a");
  REQUIRE(client->Put(client->uri().Key("a.bin"), std::string(8192, 'a')).ok());
  const std::string index = "index s3://test-bucket/sets/a --format records --record-bytes 4096";
  std::string out;

  CHECK(Shardctl(s3, index, &out, "WRONGKEY") == 1);
  CHECK_THAT(out, Catch::Contains("credentials refused") && Catch::Contains("WRONGKEY") &&
                      Catch::Contains("test-bucket"));
  CHECK(Shardctl(s3, "pack " + (tmp / "src") + " s3://test-bucket/packs/x", &out, "WRONGKEY") == 1);
  CHECK_THAT(out, Catch::Contains("credentials refused"));

  CHECK(Shardctl(s3, "index s3://no-such-bucket/sets/a --format records --record-bytes 4096", &out) == 1);
  CHECK_THAT(out, Catch::Contains("bucket no-such-bucket does not exist"));
  CHECK(Shardctl(s3, "pack " + (tmp / "src") + " s3://no-such-bucket/packs/x", &out) == 1);
  CHECK_THAT(out, Catch::Contains("bucket no-such-bucket does not exist"));

  CHECK(Shardctl(s3, "index s3://test-bucket/sets/empty --format records --record-bytes 4096", &out) == 1);
  CHECK_THAT(out, Catch::Contains("no objects under s3://test-bucket/sets/empty/"));
  CHECK(Shardctl(s3, "index s3://test-bucket/sets/a --format tar", &out) == 1);
  CHECK_THAT(out, Catch::Contains("s3://test-bucket/sets/a: no tar shard files found"));
  CHECK(Shardctl(s3, "index s3://test-bucket --format tar", &out) == 1);
  CHECK_THAT(out, Catch::Contains("names no dataset"));
  // Nothing was written by the failed runs.
  auto listed = client->List("sets/a/");
  REQUIRE(listed.ok());
  CHECK(listed->size() == 1);
}

TEST_CASE("ObjectByteSource reads any range of an object, across blocks, with few requests",
          "[dataset][objstore]") {
  objstore::testing::S3rver s3;
  auto client = Client(s3, "s3://test-bucket/o");
  std::string bytes(10000, '\0');
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>(i * 7 + i / 256);
  auto etag = client->Put("o/x", bytes);
  REQUIRE(etag.ok());
  ObjectByteSource src(*client, "o/x", bytes.size(), *etag, 1024);
  CHECK(src.name() == "s3://test-bucket/o/x");
  for (auto [offset, n] : std::vector<std::pair<uint64_t, size_t>>{
           {0, 512}, {1000, 100}, {1020, 2000}, {4096, 1024}, {9990, 10}, {0, 10000}, {5000, 0}}) {
    std::string got(n, '\0');
    REQUIRE(src.ReadAt(offset, got.data(), n).ok());
    CHECK(got == bytes.substr(offset, n));
  }
  std::string past(20, '\0');
  const Status s = src.ReadAt(9990, past.data(), 20);
  CHECK(s.code() == StatusCode::kOutOfRange);
  CHECK_THAT(s.message(), Catch::Contains("s3://test-bucket/o/x"));
  // Rewritten since it was listed: a named error, not the new bytes.
  REQUIRE(client->Put("o/x", std::string(10000, 'z')).ok());
  ObjectByteSource stale(*client, "o/x", bytes.size(), *etag, 1024);
  std::string got(100, '\0');
  const Status changed = stale.ReadAt(8000, got.data(), 100);
  CHECK(changed.code() == StatusCode::kFailedPrecondition);
  CHECK_THAT(changed.message(), Catch::Contains("changed since it was indexed"));
}

}  // namespace
}  // namespace shardcache::dataset
