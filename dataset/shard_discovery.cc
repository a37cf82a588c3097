#include "dataset/shard_discovery.h"

#include <algorithm>
#include <set>

#include <spdlog/spdlog.h>

#include "dataset/indexer.h"
#include "dataset/manifest.h"
#include "dataset/utf8.h"

namespace shardcache::dataset {
namespace {

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Directories (relative, "" = the root) that hold a .shardcache/: the root's own metadata and
// datasets of their own below it.
std::set<std::string> MetaDirs(const std::vector<ListedFile>& files) {
  const std::string meta = std::string(kMetaDirName) + "/";
  std::set<std::string> dirs;
  for (const ListedFile& f : files) {
    for (size_t at = f.path.find(meta); at != std::string::npos; at = f.path.find(meta, at + 1)) {
      if (at == 0 || f.path[at - 1] == '/') dirs.insert(at == 0 ? "" : f.path.substr(0, at - 1));
    }
  }
  return dirs;
}

// True when `path` lies in the root's .shardcache/ or in a dataset of its own below the root.
bool InMetaOrNestedDataset(const std::string& path, const std::set<std::string>& meta_dirs) {
  if (path.rfind(std::string(kMetaDirName) + "/", 0) == 0) return true;
  for (size_t slash = path.find('/'); slash != std::string::npos; slash = path.find('/', slash + 1)) {
    if (meta_dirs.count(path.substr(0, slash)) > 0) return true;
  }
  return false;
}

// Applies the format's rule to one file: OK with *keep false when it is no shard of `format`.
Status ClassifyFile(const ListedFile& f, v1::ShardFormat format, const std::set<std::string>& all_paths,
                    const std::string& root, bool* keep, ShardEntry* out) {
  *keep = false;
  const std::string abs = root + "/" + f.path;
  if (!IsValidUtf8(f.path)) {
    return InvalidArgument(abs + ": shard path is not valid UTF-8, which manifests require; rename the file");
  }
  out->path = f.path;
  out->size_bytes = f.size_bytes;
  out->companion_path.clear();
  switch (format) {
    case v1::RECORDS:
      break;
    case v1::TAR:
      if (EndsWith(f.path, ".tar.gz") || EndsWith(f.path, ".tgz")) {
        return InvalidArgument(
            abs + ": gzip-compressed tar shards cannot be served (a chunk of a compressed "
                  "stream cannot be read or verified on its own); decompress them with `gunzip` "
                  "(which leaves a .tar) and index again, or extract them and run `shardctl pack`");
      }
      if (!EndsWith(f.path, ".tar")) return Status::Ok();
      break;
    case v1::MEGATRON: {
      if (!EndsWith(f.path, ".bin")) return Status::Ok();
      const std::string idx = f.path.substr(0, f.path.size() - 4) + ".idx";
      if (all_paths.count(idx) == 0) {
        return NotFound(abs + ": megatron .bin has no matching index " + root + "/" + idx);
      }
      out->companion_path = idx;
      break;
    }
    default:
      return InvalidArgument("shard format must be records, tar or megatron");
  }
  *keep = true;
  return Status::Ok();
}

}  // namespace

Result<std::vector<ShardEntry>> SelectShards(std::vector<ListedFile> files, v1::ShardFormat format,
                                             const std::string& root) {
  std::sort(files.begin(), files.end(), [](const ListedFile& a, const ListedFile& b) { return a.path < b.path; });
  const std::set<std::string> meta_dirs = MetaDirs(files);
  for (const std::string& d : meta_dirs) {
    if (!d.empty()) spdlog::info("{}: skipping {}, which is a dataset of its own", root, d);
  }
  std::set<std::string> all_paths;
  for (const ListedFile& f : files) all_paths.insert(f.path);
  std::vector<ShardEntry> shards;
  for (const ListedFile& f : files) {
    if (InMetaOrNestedDataset(f.path, meta_dirs)) continue;
    bool keep = false;
    ShardEntry e;
    SC_RETURN_IF_ERROR(ClassifyFile(f, format, all_paths, root, &keep, &e));
    if (keep) shards.push_back(std::move(e));
  }
  if (shards.empty()) {
    return NotFound(root + ": no " + std::string(ShardFormatName(format)) + " shard files found");
  }
  return shards;
}

}  // namespace shardcache::dataset
