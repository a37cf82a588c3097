#include "dataset/indexer.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <vector>

#include <spdlog/spdlog.h>

#include "common/fs.h"
#include "dataset/byte_source.h"
#include "dataset/index_builder.h"
#include "dataset/dataset_name.h"
#include "dataset/parallel_for.h"

namespace shardcache::dataset {

namespace fs = std::filesystem;

Result<v1::ShardFormat> ParseShardFormat(const std::string& text) {
  if (text == "records") return v1::RECORDS;
  if (text == "tar") return v1::TAR;
  if (text == "megatron") return v1::MEGATRON;
  return InvalidArgument("unknown shard format '" + text + "' (expected records, tar or megatron)");
}

const char* ShardFormatName(v1::ShardFormat format) {
  switch (format) {
    case v1::RECORDS: return "records";
    case v1::TAR: return "tar";
    case v1::MEGATRON: return "megatron";
    default: return "unspecified";
  }
}

namespace {

// Every regular file below `dir`, not descending into its .shardcache or into a subdirectory
// that is a dataset of its own (SelectShards would skip their files anyway).
Result<std::vector<ListedFile>> WalkDirectory(const std::string& dir) {
  std::vector<ListedFile> files;
  std::error_code ec;
  const fs::path root(dir);
  fs::recursive_directory_iterator it(root, ec), end;
  if (ec) return ErrnoStatus(ec.value(), "list " + dir);
  for (; it != end; it.increment(ec)) {
    if (ec) return ErrnoStatus(ec.value(), "list " + dir);
    const fs::path& p = it->path();
    const std::string rel = p.lexically_relative(root).generic_string();
    std::error_code sec;
    if (it->is_directory(sec) &&
        (p.filename() == kMetaDirName || fs::exists(p / kMetaDirName, sec))) {
      // This dataset's metadata, or a dataset of its own below this one ("laion" and
      // "laion/train" both indexed): neither holds shards of this dataset.
      if (it.depth() > 0 && p.filename() != kMetaDirName) {
        spdlog::info("{}: skipping {}, which is a dataset of its own", dir, rel);
      }
      it.disable_recursion_pending();
      continue;
    }
    if (!it->is_regular_file(sec)) continue;
    struct stat st;
    if (::stat(p.c_str(), &st) != 0) return ErrnoStatus(errno, "stat " + p.string());
    files.push_back({rel, static_cast<uint64_t>(st.st_size)});
  }
  return files;
}

// The shards of a directory, read with pread.
class FileShardStore final : public ShardStore {
 public:
  explicit FileShardStore(std::string dir) : dir_(std::move(dir)) {}
  std::string Describe(const std::string& rel) const override { return dir_ + "/" + rel; }
  Result<std::unique_ptr<ByteSource>> OpenShard(const ShardEntry& shard) const override {
    const std::string abs = Describe(shard.path);
    SC_ASSIGN_OR_RETURN(auto src, FileByteSource::Open(abs));
    if (src->size() != shard.size_bytes) return FailedPrecondition(abs + ": size changed while indexing");
    return std::unique_ptr<ByteSource>(std::move(src));
  }
  Status ReadShard(const ShardEntry& shard, uint64_t offset, uint64_t length, char* buf) const override {
    const std::string abs = Describe(shard.path);
    SC_ASSIGN_OR_RETURN(UniqueFd fd, OpenFile(abs, O_RDONLY));
    Status s = PreadFull(fd.get(), buf, length, offset, abs);
    if (!s.ok()) return DataLoss(abs + ": shard shrank while hashing: " + s.message());
    return Status::Ok();
  }
  Result<std::string> ReadCompanion(const ShardEntry& shard) const override {
    return ReadFileToString(Describe(shard.companion_path));
  }

 private:
  const std::string dir_;
};

// tmp + rename without fsync; the caller makes a batch of these durable with one syncfs().
Status WriteFileUnsynced(const std::string& path, const std::string& data) {
  const std::string tmp = path + ".tmp";
  {
    SC_ASSIGN_OR_RETURN(UniqueFd fd, OpenFile(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644));
    SC_RETURN_IF_ERROR(PwriteFull(fd.get(), data.data(), data.size(), 0, tmp));
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) return ErrnoStatus(errno, "rename " + tmp);
  return Status::Ok();
}

// The name written to the manifest: `requested`, which must be trailing components of the
// directory's path, or its basename.
Result<std::string> DatasetName(const std::string& dir, const std::string& requested) {
  std::string path = fs::absolute(fs::path(dir)).lexically_normal().generic_string();
  while (path.size() > 1 && path.back() == '/') path.pop_back();  // "dir/" → "dir"
  std::string name = requested.empty() ? path.substr(path.rfind('/') + 1) : requested;
  SC_RETURN_IF_ERROR(CheckDatasetName(name).WithContext(dir));
  if (!NameIsTailOf(name, path)) {
    // path is absolute, so it has a '/' before its basename; parent is "" for "/x".
    const size_t base = path.rfind('/');
    const std::string parent = path.substr(0, base);
    const size_t up = parent.rfind('/');
    std::string choices = "'" + path.substr(base + 1) + "' for upstream root " +
                          (parent.empty() ? "/" : parent);
    if (up != std::string::npos && up > 0) {
      choices += ", '" + path.substr(up + 1) + "' for root " + path.substr(0, up);
    }
    return InvalidArgument("--name '" + name + "' does not match directory " + path +
                           ": a daemon serves a dataset under the directory's path below its "
                           "upstream root (" + choices + ", ...); use one of those, or move "
                           "the directory so that its path ends in '" + name + "'");
  }
  return name;
}

}  // namespace

Result<DatasetPtr> IndexDirectory(const std::string& dir, const IndexOptions& options) {
  SC_RETURN_IF_ERROR(CheckIndexOptions(options));
  struct stat dst;
  if (::stat(dir.c_str(), &dst) != 0) return ErrnoStatus(errno, "dataset directory " + dir);
  if (!S_ISDIR(dst.st_mode)) return InvalidArgument(dir + " is not a directory");
  SC_ASSIGN_OR_RETURN(const std::string name, DatasetName(dir, options.name));
  SC_ASSIGN_OR_RETURN(std::vector<ListedFile> files, WalkDirectory(dir));
  SC_ASSIGN_OR_RETURN(std::vector<ShardEntry> shards, SelectShards(std::move(files), options.format, dir));
  // Block tables are written as the chunks are hashed, each shard's file emptied first (a shard
  // that shrank leaves no tables of chunks it no longer has).
  const std::string meta = dir + "/" + kMetaDirName;
  SC_RETURN_IF_ERROR(MakeDirs(meta + "/blocks"));
  for (size_t i = 0; i < shards.size(); ++i) {
    SC_RETURN_IF_ERROR(OpenFile(BlockTablesPath(dir, static_cast<uint32_t>(i)), O_WRONLY | O_CREAT | O_TRUNC).status());
  }
  const uint64_t stride = BlockTableStride(options.chunk_bytes);
  auto write_table = [&](size_t shard, uint64_t chunk, std::string_view table) -> Status {
    const std::string path = BlockTablesPath(dir, static_cast<uint32_t>(shard));
    SC_ASSIGN_OR_RETURN(UniqueFd fd, OpenFile(path, O_WRONLY));
    return PwriteFull(fd.get(), table.data(), table.size(), chunk * stride, path);
  };
  SC_ASSIGN_OR_RETURN(BuiltIndex built, BuildIndex(FileShardStore(dir), shards, name, options, write_table));

  // Sample indexes, then the manifest. The sample indexes are written without a per-file fsync
  // (12 ms each: minutes for thousands of shards) and made durable by one syncfs() before the
  // manifest that references them is written atomically.
  SC_RETURN_IF_ERROR(MakeDirs(meta + "/samples"));
  SC_RETURN_IF_ERROR(ParallelFor(shards.size(), DefaultThreads(options.threads), [&](uint64_t i) -> Status {
    return WriteFileUnsynced(SampleIndexPath(dir, static_cast<uint32_t>(i)), built.sample_indexes[i]);
  }));
  {
    SC_ASSIGN_OR_RETURN(UniqueFd meta_fd, OpenFile(meta + "/samples", O_RDONLY | O_DIRECTORY));
    if (::syncfs(meta_fd.get()) != 0) return ErrnoStatus(errno, "syncfs " + meta);
  }
  // Sample indexes and block tables left over from an earlier index with more shards.
  for (size_t i = shards.size();; ++i) {
    const bool samples = ::unlink(SampleIndexPath(dir, static_cast<uint32_t>(i)).c_str()) == 0;
    const bool tables = ::unlink(BlockTablesPath(dir, static_cast<uint32_t>(i)).c_str()) == 0;
    if (!samples && !tables) break;
  }
  SC_RETURN_IF_ERROR(WriteFileAtomic(ManifestPath(dir), built.manifest_bytes));
  spdlog::debug("indexed {}: {} shards, version {}", dir, shards.size(), ManifestVersion(built.manifest_bytes));
  return LoadDatasetDir(dir);
}

}  // namespace shardcache::dataset
