#include "dataset/object_indexer.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <vector>

#include <spdlog/spdlog.h>

#include "common/mutex.h"
#include "dataset/dataset_name.h"
#include "dataset/manifest.h"
#include "dataset/object_byte_source.h"
#include "dataset/parallel_for.h"
#include "dataset/shard_discovery.h"

namespace shardcache::dataset {
namespace {

// The shards of a dataset in a bucket, read with ranged GETs pinned to their listed state.
class ObjectShardStore final : public ShardStore {
 public:
  ObjectShardStore(objstore::ObjectClient& client, std::map<std::string, objstore::ObjectInfo> listed)
      : client_(client), listed_(std::move(listed)) {}

  std::string Describe(const std::string& rel) const override {
    return client_.uri().Describe(client_.uri().Key(rel));
  }
  Result<std::unique_ptr<ByteSource>> OpenShard(const ShardEntry& shard) const override {
    const objstore::ObjectInfo& o = listed_.at(shard.path);
    return std::unique_ptr<ByteSource>(new ObjectByteSource(client_, o.key, o.size, o.etag));
  }
  Status ReadShard(const ShardEntry& shard, uint64_t offset, uint64_t length, char* buf) const override {
    const objstore::ObjectInfo& o = listed_.at(shard.path);
    objstore::RangeRead r{o.key, offset, length, o.etag, o.size, reinterpret_cast<uint8_t*>(buf)};
    return client_.ReadRanges({r}).front().status();
  }
  Result<std::string> ReadCompanion(const ShardEntry& shard) const override {
    const objstore::ObjectInfo& o = listed_.at(shard.companion_path);
    return client_.ReadRange(o.key, 0, o.size, o.etag, o.size);
  }

 private:
  objstore::ObjectClient& client_;
  const std::map<std::string, objstore::ObjectInfo> listed_;  // by path below the dataset
};

// Every object below the dataset's prefix, by path relative to it ("directory" markers, keys
// ending in '/', left out).
Result<std::map<std::string, objstore::ObjectInfo>> ListDataset(objstore::ObjectClient& client) {
  const std::string prefix = client.uri().prefix + "/";
  SC_ASSIGN_OR_RETURN(std::vector<objstore::ObjectInfo> objects, client.List(prefix));
  std::map<std::string, objstore::ObjectInfo> out;
  for (auto& o : objects) {
    if (o.key.size() <= prefix.size() || o.key.back() == '/') continue;
    out.emplace(o.key.substr(prefix.size()), std::move(o));
  }
  if (out.empty()) {
    return NotFound("no objects under " + client.uri().Describe(prefix) + " at " + client.endpoint() +
                    ": nothing to index (upload the shards there first, or check the bucket and prefix)");
  }
  return out;
}

std::string SampleIndexKey(const objstore::ObjectUri& uri, size_t shard) {
  return uri.Key(std::string(kMetaDirName) + "/samples/" + std::to_string(shard) + ".pb");
}

// Collects each shard's block tables as its chunks are hashed and uploads the shard's tables
// object (BlockTablesRelPath) once its last chunk is in: only the shards being hashed are in
// memory (ParallelFor takes chunks in order), never the tables of the whole bucket.
class TableUploader {
 public:
  TableUploader(objstore::ObjectClient& client, const std::vector<ShardEntry>& shards, uint64_t chunk_bytes)
      : client_(client), stride_(BlockTableStride(chunk_bytes)), shards_(shards.size()) {
    for (size_t i = 0; i < shards.size(); ++i) {
      MutexLock lock(&shards_[i].mu);
      shards_[i].left = (shards[i].size_bytes + chunk_bytes - 1) / chunk_bytes;
    }
  }

  Status Add(size_t shard, uint64_t chunk, std::string_view table) {
    Shard& s = shards_[shard];
    std::string done;
    {
      MutexLock lock(&s.mu);
      // The last chunk's table, shorter than the stride, ends the object.
      s.bytes.resize(std::max<uint64_t>(s.bytes.size(), chunk * stride_ + table.size()));
      std::memcpy(s.bytes.data() + chunk * stride_, table.data(), table.size());
      if (--s.left > 0) return Status::Ok();
      done.swap(s.bytes);
    }
    auto etag = client_.Put(client_.uri().Key(BlockTablesRelPath(static_cast<uint32_t>(shard))), done);
    return etag.ok() ? Status::Ok() : etag.status().WithContext("uploading the block tables of shard " + std::to_string(shard));
  }

 private:
  struct Shard {
    Mutex mu;
    uint64_t left GUARDED_BY(mu) = 0;  // chunks not yet hashed
    std::string bytes GUARDED_BY(mu);
  };
  objstore::ObjectClient& client_;
  const uint64_t stride_;
  std::vector<Shard> shards_;
};

}  // namespace

unsigned ObjectIndexThreads(unsigned requested) {
  return requested != 0 ? requested : std::max(kMinObjectIndexThreads, DefaultThreads(0));
}

Result<std::string> ObjectDatasetName(const objstore::ObjectUri& uri, const std::string& requested) {
  if (uri.prefix.empty()) {
    return InvalidArgument(uri.Describe("") + " names no dataset: a dataset lives below a key prefix, "
                           "s3://BUCKET/[PREFIX/]NAME");
  }
  const std::string name = requested.empty() ? uri.prefix.substr(uri.prefix.rfind('/') + 1) : requested;
  SC_RETURN_IF_ERROR(CheckDatasetName(name).WithContext(uri.Describe(uri.prefix)));
  if (!NameIsTailOf(name, "/" + uri.prefix)) {
    return InvalidArgument("--name '" + name + "' does not match " + uri.Describe(uri.prefix) +
                           ": a daemon serves a dataset under its key prefix below the upstream's "
                           "(s3://" + uri.bucket + "/" + uri.prefix + " is dataset '" +
                           uri.prefix.substr(uri.prefix.rfind('/') + 1) + "' of upstream s3://" + uri.bucket +
                           "/" + uri.prefix.substr(0, uri.prefix.rfind('/') + 1) + "...); use trailing "
                           "components of '" + uri.prefix + "'");
  }
  return name;
}

Status UploadIndex(objstore::ObjectClient& client, const BuiltIndex& index, unsigned threads) {
  const objstore::ObjectUri& uri = client.uri();
  SC_RETURN_IF_ERROR(ParallelFor(index.sample_indexes.size(), threads, [&](uint64_t i) -> Status {
    auto etag = client.Put(SampleIndexKey(uri, i), index.sample_indexes[i]);
    return etag.ok() ? Status::Ok() : etag.status().WithContext("uploading sample index " + std::to_string(i));
  }));
  const std::string manifest_key = uri.Key(std::string(kMetaDirName) + "/manifest.pb");
  auto etag = client.Put(manifest_key, index.manifest_bytes);
  return etag.ok() ? Status::Ok() : etag.status().WithContext("uploading the manifest");
}

Result<DatasetPtr> IndexBucket(objstore::ObjectClient& client, const IndexOptions& options) {
  SC_RETURN_IF_ERROR(CheckIndexOptions(options));
  const objstore::ObjectUri& uri = client.uri();
  if (!uri.is_s3()) {
    return Unimplemented("cannot index " + uri.Describe(uri.prefix) +
                         " in place: plain http(s) stores can neither be listed nor written; index a "
                         "local copy and publish its .shardcache/ with the shards");
  }
  SC_ASSIGN_OR_RETURN(const std::string name, ObjectDatasetName(uri, options.name));
  SC_ASSIGN_OR_RETURN(auto listed, ListDataset(client));
  std::vector<ListedFile> files;
  for (const auto& [rel, o] : listed) files.push_back({rel, o.size});
  SC_ASSIGN_OR_RETURN(std::vector<ShardEntry> shards,
                      SelectShards(std::move(files), options.format, uri.Describe(uri.prefix)));
  // Sample indexes and block tables of an earlier index with more shards, removed once the new
  // manifest is up.
  std::vector<std::string> stale;
  for (size_t i = shards.size();; ++i) {
    const std::string samples = std::string(kMetaDirName) + "/samples/" + std::to_string(i) + ".pb";
    const std::string tables = BlockTablesRelPath(static_cast<uint32_t>(i));
    if (listed.count(samples)) stale.push_back(uri.Key(samples));
    if (listed.count(tables)) stale.push_back(uri.Key(tables));
    if (!listed.count(samples) && !listed.count(tables)) break;
  }
  IndexOptions o = options;
  o.threads = ObjectIndexThreads(options.threads);
  TableUploader tables(client, shards, o.chunk_bytes);
  SC_ASSIGN_OR_RETURN(BuiltIndex built,
                      BuildIndex(ObjectShardStore(client, std::move(listed)), shards, name, o,
                                 [&](size_t shard, uint64_t chunk, std::string_view table) {
                                   return tables.Add(shard, chunk, table);
                                 }));
  SC_RETURN_IF_ERROR(UploadIndex(client, built, o.threads));
  for (const std::string& key : stale) SC_RETURN_IF_ERROR(client.Delete(key).WithContext("removing a stale sample index"));
  spdlog::debug("indexed {}: {} shards, version {}", uri.Describe(uri.prefix), shards.size(),
                ManifestVersion(built.manifest_bytes));
  return MakeDataset(std::move(built.manifest_bytes), uri.Describe(uri.Key(std::string(kMetaDirName) + "/manifest.pb")),
                     name);
}

}  // namespace shardcache::dataset
