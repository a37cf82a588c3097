#include "dataset/object_packer.h"

#include <stdlib.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <functional>

#include "common/fs.h"
#include "dataset/object_indexer.h"
#include "dataset/parallel_for.h"

namespace shardcache::dataset {
namespace {

namespace fs = std::filesystem;

// A fresh directory below `parent`, removed with everything in it when this goes away.
class StagingDir {
 public:
  static Result<std::unique_ptr<StagingDir>> Create(const std::string& parent) {
    std::string tmpl = parent + "/shardctl-pack-XXXXXX";
    if (::mkdtemp(tmpl.data()) == nullptr) return ErrnoStatus(errno, "create a staging directory in " + parent);
    return std::unique_ptr<StagingDir>(new StagingDir(tmpl));
  }
  ~StagingDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  explicit StagingDir(std::string path) : path_(std::move(path)) {}
  const std::string path_;
};

// The bucket can be reached with these credentials and the dataset's prefix is still empty.
Status CheckEmptyPrefix(objstore::ObjectClient& client) {
  const objstore::ObjectUri& uri = client.uri();
  SC_ASSIGN_OR_RETURN(auto objects, client.List(uri.prefix + "/"));
  if (!objects.empty()) {
    return FailedPrecondition(uri.Describe(uri.prefix + "/") + " already holds " + std::to_string(objects.size()) +
                              " objects (" + uri.Describe(objects.front().key) +
                              ", ...); pack writes a new dataset: choose an empty prefix");
  }
  return Status::Ok();
}

// Uploads every shard of the dataset in `dir` with its block tables, then its index (manifest
// last).
Status UploadDataset(objstore::ObjectClient& client, const std::string& dir, const Dataset& d,
                     const PackOptions& options) {
  const v1::Manifest& m = d.manifest;
  std::atomic<uint64_t> done_bytes{0};
  std::function<void()> tick;
  if (options.progress) {
    tick = [&] { options.progress("upload", done_bytes.load(std::memory_order_relaxed), m.total_bytes()); };
  }
  const unsigned streams = std::min(kPackUploadStreams, DefaultThreads(options.threads));
  SC_RETURN_IF_ERROR(ParallelFor(static_cast<uint64_t>(m.shards_size()), streams, [&](uint64_t i) -> Status {
    const std::string& path = m.shards(static_cast<int>(i)).path();
    // A shard of many GiB goes up as a multipart upload, one part in memory at a time.
    auto etag = client.PutFile(client.uri().Key(path), dir + "/" + path);
    if (!etag.ok()) return etag.status().WithContext("uploading shard " + std::to_string(i));
    const auto shard = static_cast<uint32_t>(i);
    etag = client.PutFile(client.uri().Key(BlockTablesRelPath(shard)), BlockTablesPath(dir, shard));
    if (!etag.ok()) return etag.status().WithContext("uploading the block tables of shard " + std::to_string(i));
    done_bytes.fetch_add(m.shards(static_cast<int>(i)).size_bytes(), std::memory_order_relaxed);
    return Status::Ok();
  }, tick));
  BuiltIndex index;
  index.manifest_bytes = d.manifest_bytes;
  for (int i = 0; i < m.shards_size(); ++i) {
    SC_ASSIGN_OR_RETURN(std::string bytes, ReadFileToString(SampleIndexPath(dir, static_cast<uint32_t>(i))));
    index.sample_indexes.push_back(std::move(bytes));
  }
  return UploadIndex(client, index, ObjectIndexThreads(options.threads));
}

}  // namespace

Result<PackResult> PackToBucket(const std::string& src, objstore::ObjectClient& client, const std::string& staging_dir,
                                const PackOptions& options) {
  const objstore::ObjectUri& uri = client.uri();
  if (!uri.is_s3()) {
    return Unimplemented("cannot pack into " + uri.Describe(uri.prefix) + ": plain http(s) stores are read-only");
  }
  SC_ASSIGN_OR_RETURN(const std::string name, ObjectDatasetName(uri, options.name));
  SC_RETURN_IF_ERROR(CheckEmptyPrefix(client));
  SC_ASSIGN_OR_RETURN(auto staging, StagingDir::Create(staging_dir));
  // Staged as <staging>/<the prefix's last components = name>, so --name passes the packer's
  // own check of it against the output directory's path.
  const std::string out = staging->path() + "/" + name;
  SC_RETURN_IF_ERROR(MakeDirs(fs::path(out).parent_path().string()));
  PackOptions local = options;
  local.name = name;
  SC_ASSIGN_OR_RETURN(PackResult packed, PackDirectory(src, out, local));
  SC_RETURN_IF_ERROR(UploadDataset(client, out, *packed.dataset, options));
  SC_ASSIGN_OR_RETURN(packed.dataset,
                      MakeDataset(packed.dataset->manifest_bytes,
                                  uri.Describe(uri.Key(std::string(kMetaDirName) + "/manifest.pb")), name));
  return packed;
}

}  // namespace shardcache::dataset
