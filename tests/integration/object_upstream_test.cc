// An origin shardcached whose upstream is a bucket (s3rver on loopback): a dataset whose shards
// are uploaded without an index and indexed in place with `shardctl index s3://…` reaches
// trainers on a node daemon byte-exact, and `shardctl fetch` through the node returns the shard
// files unchanged (issue 19).
#include <catch2/catch.hpp>
#include <filesystem>
#include <thread>

#include "common/fs.h"
#include "integration/daemons.h"
#include "integration/training_job.h"
#include "objstore/object_client.h"
#include "objstore/test_servers.h"
#include "testing/datasets.h"

namespace shardcache::testing {
namespace {

namespace fs = std::filesystem;

// Uploads the shard files below `root` (not the local index in .shardcache/).
void UploadShards(objstore::ObjectClient& client, const std::string& root) {
  for (const auto& e : fs::recursive_directory_iterator(root)) {
    if (!e.is_regular_file() || e.path().string().find("/.shardcache/") != std::string::npos) continue;
    auto bytes = ReadFileToString(e.path().string());
    REQUIRE(bytes.ok());
    REQUIRE(client.Put(client.uri().Key(fs::relative(e.path(), root).string()), *bytes).ok());
  }
}

TEST_CASE("a dataset in a bucket served by an s3:// origin reaches trainers on a node byte-exact",
          "[integration][objstore]") {
  TempDir dir;
  const std::string root = dir / "data";
  const uint64_t shards = 3, per_shard = 200, record_bytes = 4096;
  REQUIRE(MakeDirs(root).ok());
  REQUIRE(MakeRecordsDataset(root, "rec", shards, per_shard, record_bytes, 256 * 1024).ok());
  objstore::testing::S3rver s3;
  objstore::ObjectStoreOptions o;
  o.endpoint = s3.endpoint();
  o.credentials = {"S3RVER", "S3RVER", "", ""};
  auto client = objstore::ObjectClient::Open(*objstore::ParseObjectUri("s3://test-bucket/datasets"), o);
  REQUIRE(client.ok());
  UploadShards(**client, root);
  {
    std::string out;
    const int rc = RunCommand("env AWS_ACCESS_KEY_ID=S3RVER AWS_SECRET_ACCESS_KEY=S3RVER " + Bin("shardctl") +
                                  " index s3://test-bucket/datasets/rec --format records --record-bytes 4096 "
                                  "--chunk-bytes 256KiB --endpoint " + s3.endpoint(),
                              &out);
    INFO(out);
    REQUIRE(rc == 0);
  }

  Daemon origin(dir, "origin", "s3://test-bucket/datasets", 0, 8 << 20, "",
                "[objstore]\nendpoint = \"" + s3.endpoint() +
                    "\"\naccess_key_id = \"S3RVER\"\nsecret_access_key = \"NeverLoggedSecret\"\n");
  {
    // Log everything the origin says about its upstream, to check below that no secret is in it.
    auto text = ReadFileToString(origin.config);
    REQUIRE(text.ok());
    const size_t at = text->find("level = \"warn\"");
    REQUIRE(at != std::string::npos);
    REQUIRE(WriteFileAtomic(origin.config, text->replace(at, 14, "level = \"info\"")).ok());
  }
  origin.Start();
  Daemon node(dir, "node", origin.Url(), 64 << 20, 8 << 20, dir / "node.sock");
  node.Start();

  Rank ranks[2];
  std::thread t0([&] { ReadEpoch(node.socket, 0, per_shard, record_bytes, &ranks[0], std::chrono::milliseconds(0)); });
  std::thread t1([&] { ReadEpoch(node.socket, 1, per_shard, record_bytes, &ranks[1], std::chrono::milliseconds(0)); });
  t0.join();
  t1.join();
  std::vector<uint64_t> all;
  for (const Rank& r : ranks) {
    INFO(r.error.ToString() << "\norigin log:\n" << LogTail(origin.log) << "\nnode log:\n" << LogTail(node.log));
    REQUIRE(r.error.ok());
    all.insert(all.end(), r.ids.begin(), r.ids.end());
  }
  std::sort(all.begin(), all.end());
  REQUIRE(all.size() == shards * per_shard);  // drop_last off: every sample once
  for (uint64_t i = 0; i < all.size(); ++i) REQUIRE(all[i] == i);

  std::string output;
  const int rc = FetchAll(node.Url(), "rec", dir / "out", &output);
  INFO(output);
  REQUIRE(rc == 0);
  RequireSameShards(root + "/rec", dir / "out");
  // The origin read each shard byte from the bucket at least once (the node's cache keeps them).
  CHECK(Metric(origin.metrics_port, "shardcache_objstore_read_bytes_total") >= shards * per_shard * record_bytes);
  CHECK(Metric(origin.metrics_port, "shardcache_objstore_checksum_failures_total") == 0);
  // s3rver checks the key id, not the signature: any secret works, and none reaches the log.
  auto log = ReadFileToString(origin.log);
  REQUIRE(log.ok());
  CHECK_THAT(*log, Catch::Contains("secret redacted"));
  CHECK_THAT(*log, !Catch::Contains("NeverLoggedSecret"));
}

}  // namespace
}  // namespace shardcache::testing
