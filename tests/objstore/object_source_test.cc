// ObjectSource: datasets indexed on disk, uploaded to s3rver (or served by nginx), read back as
// verified chunks — and the named errors when a shard object changes or goes missing.
#include "daemon/upstream/object_source.h"

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/metrics.h"
#include "objstore/test_servers.h"
#include "testing/datasets.h"
#include "testing/temp_dir.h"

namespace shardcache::upstream {
namespace {

namespace fs = std::filesystem;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

ReadOptions Soon() {
  ReadOptions o;
  o.deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  return o;
}

// Every chunk of `shard`, concatenated, or the read's error.
Result<std::string> ReadShard(ObjectSource& src, const DatasetPtr& d, uint32_t shard) {
  std::string out;
  uint64_t next = 0;
  Status s = src.ReadChunks(d, shard, 0, dataset::ChunkCount(d->manifest, shard), Soon(),
                            [&](uint64_t c, const ChunkPtr& chunk) {
                              if (c != next++) return Internal("chunks out of order");
                              out.append(reinterpret_cast<const char*>(chunk->bytes.data()), chunk->bytes.size());
                              return Status::Ok();
                            });
  if (!s.ok()) return s;
  return out;
}

// Uploads every file below root/dir as PREFIX/dir/<relative path>.
void Upload(objstore::ObjectClient& client, const std::string& root, const std::string& dir) {
  for (const auto& e : fs::recursive_directory_iterator(fs::path(root) / dir)) {
    if (!e.is_regular_file()) continue;
    const std::string rel = fs::relative(e.path(), root).string();
    auto put = client.Put(client.uri().Key(rel), ReadFile(e.path().string()));
    INFO(rel << ": " << put.status().ToString());
    REQUIRE(put.ok());
  }
}

objstore::ObjectStoreOptions S3rverOptions(const objstore::testing::S3rver& server) {
  objstore::ObjectStoreOptions o;
  o.endpoint = server.endpoint();
  o.credentials = {"S3RVER", "S3RVER", "", ""};
  o.max_connections = 8;
  o.backoff_initial_ms = 10;
  return o;
}

std::unique_ptr<ObjectSource> OpenSource(const std::string& uri, const objstore::ObjectStoreOptions& o) {
  auto src = ObjectSource::Open(uri, o);
  INFO(src.status().ToString());
  REQUIRE(src.ok());
  return std::move(*src);
}

TEST_CASE("a dataset uploaded to a bucket is listed, opened and read chunk by chunk, verified",
          "[objstore][upstream]") {
  shardcache::testing::TempDir root;
  auto local = shardcache::testing::MakeRecordsDataset(root.path(), "sets/tokens", 3, 150, 2000, 64 * 1024);
  REQUIRE(local.ok());
  objstore::testing::S3rver server;
  auto src = OpenSource("s3://test-bucket/data", S3rverOptions(server));
  Upload(src->client(), root.path(), "sets");

  auto list = src->ListDatasets();
  INFO(list.status().ToString());
  REQUIRE(list.ok());
  REQUIRE(list->size() == 1);
  CHECK((*list)[0].name() == "sets/tokens");
  auto d = src->OpenDataset("sets/tokens");
  INFO(d.status().ToString());
  REQUIRE(d.ok());
  CHECK((*d)->version == (*local)->version);
  for (uint32_t shard = 0; shard < 3; ++shard) {
    const std::string path = root / ("sets/tokens/" + (*d)->manifest.shards(static_cast<int>(shard)).path());
    auto bytes = ReadShard(*src, *d, shard);
    INFO(bytes.status().ToString());
    REQUIRE(bytes.ok());
    CHECK(*bytes == ReadFile(path));
    auto index = src->GetSampleIndex(*d, shard);
    REQUIRE(index.ok());
    CHECK(*index == ReadFile(dataset::SampleIndexPath(root / "sets/tokens", shard)));
  }
  auto missing = src->OpenDataset("sets/nope");
  CHECK(missing.status().code() == StatusCode::kNotFound);
  CHECK_THAT(missing.status().message(), Catch::StartsWith("dataset 'sets/nope' not found"));
}

TEST_CASE("pieces are read as the blocks that cover them, verified against the stored block tables",
          "[objstore][upstream][blocks]") {
  shardcache::testing::TempDir root;
  auto local = shardcache::testing::MakeRecordsDataset(root.path(), "ds", 2, 64, 4096, 64 * 1024);
  REQUIRE(local.ok());
  objstore::testing::S3rver server;
  auto* read_bytes = metrics::Registry::Global().GetCounter("shardcache_objstore_read_bytes_total", "");
  auto* failures = metrics::Registry::Global().GetCounter("shardcache_objstore_checksum_failures_total", "");
  const std::string shard1 = ReadFile(root / "ds/shard-00001.bin");
  auto src = OpenSource("s3://test-bucket", S3rverOptions(server));
  Upload(src->client(), root.path(), "ds");
  // Opened after a section changed the bucket: sizes and ETags as they are then.
  auto open = [&] {
    auto d = src->OpenDataset("ds");
    REQUIRE(d.ok());
    return *d;
  };
  // Two samples of chunk 1 (one across a block boundary) and one of chunk 3.
  auto read = [&](const DatasetPtr& d, std::string* got) {
    got->assign(3 * 4096, '\0');
    uint8_t* out = reinterpret_cast<uint8_t*>(got->data());
    const ChunkPiece pieces[] = {{1, 4096, 4096, out}, {1, 14336, 4096, out + 4096}, {3, 0, 4096, out + 8192}};
    return src->ReadPieces(d, 1, pieces, Soon());
  };
  const std::string want = shard1.substr(65536 + 4096, 4096) + shard1.substr(65536 + 14336, 4096) +
                           shard1.substr(3 * 65536, 4096);
  // One read, checked byte-exact: the bytes it took from the bucket.
  auto bytes_read = [&](const DatasetPtr& d) {
    std::string got;
    const uint64_t before = read_bytes->Value();
    REQUIRE(read(d, &got).ok());
    CHECK(got == want);
    return read_bytes->Value() - before;
  };

  SECTION("with the tables: only the covering blocks travel") {
    CHECK(src->FetchesBlockRanges());
    const DatasetPtr d = open();
    // Blocks 0, 0-1 of chunk 1 and 0 of chunk 3 (16 KiB each), plus two 64-byte tables.
    CHECK(bytes_read(d) == 4 * 16384 + 2 * 4 * kBlockHashBytes);
    CHECK(bytes_read(d) == 4 * 16384);  // the tables are kept
  }
  SECTION("without them (an index from before the tables): whole chunks, still exact") {
    REQUIRE(src->client().Delete("ds/" + dataset::BlockTablesRelPath(1)).ok());
    const DatasetPtr d = open();
    // The blocks went with the table's request (unused), then chunks 1 and 3 whole.
    CHECK(bytes_read(d) == 4 * 16384 + 2 * 65536);
    CHECK(bytes_read(d) == 2 * 65536);  // the missing tables object is not asked for again
  }
  SECTION("a table that fails the manifest's check is not used") {
    std::string tables = ReadFile(dataset::BlockTablesPath(root / "ds", 1));
    tables[dataset::BlockTableStride(65536) + 5] ^= 0x11;  // chunk 1's
    REQUIRE(src->client().Put("ds/" + dataset::BlockTablesRelPath(1), tables).ok());
    // The blocks and both tables, then chunk 1 whole: its blocks are not served on a bad table.
    CHECK(bytes_read(open()) == 4 * 16384 + 2 * 4 * kBlockHashBytes + 65536);
  }
  SECTION("a block whose bytes changed is DataLoss naming the object, never served") {
    std::string bytes = shard1;
    bytes[3 * 65536 + 100] ^= 0x5a;  // chunk 3, block 0
    REQUIRE(src->client().Put("ds/shard-00001.bin", bytes).ok());
    const DatasetPtr d = open();  // only the hashes tell
    std::string got;
    const uint64_t failed = failures->Value();
    const Status s = read(d, &got);
    CHECK(s.code() == StatusCode::kDataLoss);
    CHECK_THAT(s.message(), Catch::Contains("s3://test-bucket/ds/shard-00001.bin") && Catch::Contains("chunk 3") &&
                                Catch::Contains("block 0"));
    CHECK(failures->Value() == failed + 1);
  }
}

TEST_CASE("a shard object rewritten after indexing is a named error, and wrong bytes are DataLoss",
          "[objstore][upstream]") {
  shardcache::testing::TempDir root;
  auto local = shardcache::testing::MakeRecordsDataset(root.path(), "ds", 1, 100, 1000, 16 * 1024);
  REQUIRE(local.ok());
  objstore::testing::S3rver server;
  auto src = OpenSource("s3://test-bucket", S3rverOptions(server));
  Upload(src->client(), root.path(), "ds");
  auto d = src->OpenDataset("ds");
  REQUIRE(d.ok());
  const std::string key = "ds/" + (*d)->manifest.shards(0).path();
  std::string bytes = ReadFile(root / key);
  bytes[bytes.size() / 2] ^= 0x5a;  // same size, other bytes
  REQUIRE(src->client().Put(key, bytes).ok());

  auto changed = ReadShard(*src, *d, 0);
  REQUIRE(changed.status().code() == StatusCode::kFailedPrecondition);
  CHECK_THAT(changed.status().message(), Catch::Contains("object s3://test-bucket/" + key + " changed since it was indexed"));

  // A source that meets the rewritten object first has only the chunk hashes to go by.
  auto fresh = OpenSource("s3://test-bucket", S3rverOptions(server));
  auto d2 = fresh->OpenDataset("ds");
  REQUIRE(d2.ok());
  auto corrupt = ReadShard(*fresh, *d2, 0);
  REQUIRE(corrupt.status().code() == StatusCode::kDataLoss);
  CHECK_THAT(corrupt.status().message(), Catch::Contains("s3://test-bucket/" + key + " (dataset 'ds', shard 0, chunk "));

  REQUIRE(src->client().Put(key, bytes.substr(0, 100)).ok());
  auto shorter = OpenSource("s3://test-bucket", S3rverOptions(server))->OpenDataset("ds");
  REQUIRE(shorter.status().code() == StatusCode::kDataLoss);
  CHECK_THAT(shorter.status().message(), Catch::Contains("is 100 bytes; its manifest says"));
}

TEST_CASE("a dataset served by nginx over https is read by name, verified", "[objstore][upstream]") {
  shardcache::testing::TempDir root;
  // 37 chunks per shard: more than ReadChunks keeps in flight, so its window slides.
  auto local = shardcache::testing::MakeRecordsDataset(root.path(), "pub/ds", 2, 200, 3000, 16 * 1024);
  REQUIRE(local.ok());
  objstore::testing::Nginx nginx(root.path());
  objstore::ObjectStoreOptions o;
  o.ca_file = nginx.ca_file();
  auto src = OpenSource(nginx.https_origin() + "/pub", o);
  CHECK(src->ListDatasets().status().code() == StatusCode::kUnimplemented);
  auto d = src->OpenDataset("ds");
  INFO(d.status().ToString());
  REQUIRE(d.ok());
  CHECK((*d)->version == (*local)->version);
  CHECK(dataset::ChunkCount((*d)->manifest, 0) > ObjectSource::kReadWindowChunks);
  for (uint32_t shard = 0; shard < 2; ++shard) {
    auto bytes = ReadShard(*src, *d, shard);
    INFO(bytes.status().ToString());
    REQUIRE(bytes.ok());
    CHECK(*bytes == ReadFile(root / ("pub/ds/" + (*d)->manifest.shards(static_cast<int>(shard)).path())));
  }
  // A shard file gone from the server: the dataset does not open, naming the shard.
  const std::string gone = "pub/ds/" + (*d)->manifest.shards(1).path();
  fs::remove(root / gone);
  auto fresh = OpenSource(nginx.https_origin() + "/pub", o);
  auto missing = fresh->OpenDataset("ds");
  REQUIRE(missing.status().code() == StatusCode::kNotFound);
  CHECK_THAT(missing.status().message(), Catch::StartsWith("shard 1 of dataset 'ds': object " + nginx.https_origin() +
                                                           "/" + gone + " does not exist"));
}

}  // namespace
}  // namespace shardcache::upstream
