#include "daemon/upstream/file_source.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdlib>

#include <spdlog/spdlog.h>

#include "common/log.h"
#include "common/metrics.h"

namespace shardcache::upstream {
namespace {

metrics::Counter* ChecksumFailures() {
  static metrics::Counter* c = metrics::Registry::Global().GetCounter(
      "shardcache_origin_checksum_failures_total",
      "Chunks read from the origin's files whose xxh3-128 did not match the manifest");
  return c;
}

metrics::Counter* FileReadBytes() {
  static metrics::Counter* c = metrics::Registry::Global().GetCounter(
      "shardcache_file_read_bytes_total", "Bytes read from dataset files by the file upstream");
  return c;
}

std::string ProcFdPath(int fd) {
  char buf[PATH_MAX];
  const std::string link = "/proc/self/fd/" + std::to_string(fd);
  ssize_t n = ::readlink(link.c_str(), buf, sizeof buf - 1);
  if (n < 0) return "";
  return std::string(buf, static_cast<size_t>(n));
}

}  // namespace

Result<std::unique_ptr<FileSource>> FileSource::Open(const std::string& root) {
  int fd = ::open(root.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOTDIR) return FailedPrecondition("file upstream root " + root + " is not a directory");
    return ErrnoStatus(errno, "open file upstream root " + root);
  }
  // The file upstream's families exist, at zero, from the start.
  ChecksumFailures();
  FileReadBytes();
  return std::unique_ptr<FileSource>(new FileSource(root, UniqueFd(fd)));
}

Result<UniqueFd> FileSource::OpenBeneath(const std::string& relative, int flags) const {
  const std::string shown = root_ + "/" + relative;
  open_how how{};
  how.flags = static_cast<uint64_t>(flags | O_CLOEXEC);
  how.resolve = RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS;
  long fd = ::syscall(SYS_openat2, root_fd_.get(), relative.c_str(), &how, sizeof how);
  if (fd < 0 && (errno == ENOSYS || errno == EXDEV)) {
    // Kernels before 5.6, or a path RESOLVE_BENEATH refuses lexically (an absolute symlink,
    // "..") that may still land inside the root: open, then check where the descriptor
    // really points. Checking the open descriptor leaves no window for a swapped link.
    fd = ::openat(root_fd_.get(), relative.c_str(), flags | O_CLOEXEC);
    if (fd >= 0) {
      const std::string real_root = ProcFdPath(root_fd_.get());
      const std::string real = ProcFdPath(static_cast<int>(fd));
      if (real_root.empty() || real.compare(0, real_root.size() + 1, real_root + "/") != 0) {
        ::close(static_cast<int>(fd));
        errno = EXDEV;
        fd = -1;
      }
    }
  }
  if (fd < 0) {
    if (errno == EXDEV || errno == ELOOP) {
      return PermissionDenied(shown + " resolves outside the upstream root " + root_ +
                              " (symlink or '..' leaving the root)");
    }
    return ErrnoStatus(errno, "open " + shown);
  }
  return UniqueFd(static_cast<int>(fd));
}

Result<UniqueFd> FileSource::OpenShard(const dataset::Dataset& d, uint32_t shard) const {
  const auto& s = d.manifest.shards(static_cast<int>(shard));
  const std::string rel = d.name + "/" + s.path();
  SC_ASSIGN_OR_RETURN(UniqueFd fd, OpenBeneath(rel, O_RDONLY));
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return ErrnoStatus(errno, "stat " + root_ + "/" + rel);
  if (!S_ISREG(st.st_mode)) {
    return FailedPrecondition(root_ + "/" + rel + " (shard " + std::to_string(shard) +
                              " of dataset '" + d.name + "') is not a regular file");
  }
  if (static_cast<uint64_t>(st.st_size) != s.size_bytes()) {
    return DataLoss(root_ + "/" + rel + " (shard " + std::to_string(shard) + " of dataset '" +
                    d.name + "') is " + std::to_string(st.st_size) + " bytes; its manifest says " +
                    std::to_string(s.size_bytes()) + " — re-index the dataset");
  }
  return fd;
}

Result<DatasetPtr> FileSource::OpenDataset(const std::string& name) {
  SC_RETURN_IF_ERROR(CheckDatasetName(name));
  const std::string rel = name + "/" + dataset::kMetaDirName + "/manifest.pb";
  auto fd = OpenBeneath(rel, O_RDONLY);
  if (!fd.ok()) {
    if (fd.status().code() == StatusCode::kNotFound) {
      return NotFound("dataset '" + name + "' not found under " + root_ +
                      " (no " + rel + ")");
    }
    return fd.status();
  }
  struct stat st;
  if (::fstat(fd->get(), &st) != 0) return ErrnoStatus(errno, "stat " + root_ + "/" + rel);
  const int64_t mtime_ns = static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
  {
    MutexLock lock(&mu_);
    auto it = cache_.find(name);
    if (it != cache_.end() && it->second.dev == st.st_dev && it->second.ino == st.st_ino &&
        it->second.size == st.st_size && it->second.mtime_ns == mtime_ns) {
      return it->second.dataset;
    }
  }
  const std::string where = root_ + "/" + rel;
  std::string bytes(static_cast<size_t>(st.st_size), '\0');
  SC_RETURN_IF_ERROR(PreadFull(fd->get(), bytes.data(), bytes.size(), 0, where));
  SC_ASSIGN_OR_RETURN(DatasetPtr d, dataset::MakeDataset(std::move(bytes), where, name));
  if (!dataset::NameIsTailOf(d->manifest.name(), name)) {
    spdlog::info("dataset '{}' was indexed as '{}' (directory renamed or moved since); serving "
                 "it as '{}', its path below {}", name, d->manifest.name(), name, root_);
  }
  for (int i = 0; i < d->manifest.shards_size(); ++i) {
    SC_ASSIGN_OR_RETURN(UniqueFd shard_fd, OpenShard(*d, static_cast<uint32_t>(i)));
    (void)shard_fd;
  }
  MutexLock lock(&mu_);
  Cached& c = cache_[name];
  if (c.dataset && c.dataset->version != d->version) {
    spdlog::info("dataset '{}' changed: version {} -> {}", name, c.dataset->version, d->version);
  }
  c = Cached{d, st.st_dev, st.st_ino, st.st_size, mtime_ns};
  return d;
}

Result<std::vector<v1::DatasetSummary>> FileSource::ListDatasets() {
  std::vector<v1::DatasetSummary> out;
  SC_RETURN_IF_ERROR(ListBelow("", 0, &out));
  std::sort(out.begin(), out.end(), [](const v1::DatasetSummary& a, const v1::DatasetSummary& b) {
    return a.name() < b.name();
  });
  return out;
}

Status FileSource::ListBelow(const std::string& dir, size_t depth, std::vector<v1::DatasetSummary>* out) {
  const std::string shown = dir.empty() ? root_ : root_ + "/" + dir;
  UniqueFd dfd;
  if (dir.empty()) {
    dfd = UniqueFd(::openat(root_fd_.get(), ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (!dfd.valid()) return ErrnoStatus(errno, "open " + shown);
  } else {
    SC_ASSIGN_OR_RETURN(dfd, OpenBeneath(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW));
  }
  DIR* listing = ::fdopendir(dfd.get());
  if (listing == nullptr) return ErrnoStatus(errno, "list " + shown);
  dfd.Release();  // closedir closes it
  struct Entry {
    std::string name;
    bool real_dir;
  };
  std::vector<Entry> entries;
  while (dirent* e = ::readdir(listing)) {
    const std::string n = e->d_name;
    if (n.empty() || n[0] == '.') continue;
    if (e->d_type != DT_DIR && e->d_type != DT_LNK && e->d_type != DT_UNKNOWN) continue;
    bool real_dir = e->d_type == DT_DIR;
    struct stat st;
    if (e->d_type == DT_UNKNOWN && ::fstatat(::dirfd(listing), e->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0) {
      real_dir = S_ISDIR(st.st_mode);
    }
    entries.push_back({dir.empty() ? n : dir + "/" + n, real_dir});
  }
  ::closedir(listing);
  for (const Entry& e : entries) {
    if (!CheckDatasetName(e.name).ok()) continue;
    auto meta = OpenBeneath(e.name + "/" + dataset::kMetaDirName, O_RDONLY | O_DIRECTORY);
    if (meta.status().code() == StatusCode::kNotFound) {
      // Not a dataset: look for datasets below it. A dataset's own subdirectories hold its
      // shards, and symlinked directories are followed only as datasets (no loops).
      if (e.real_dir && depth + 1 < dataset::kMaxDatasetNameComponents) {
        SC_RETURN_IF_ERROR(ListBelow(e.name, depth + 1, out));
      }
      continue;
    }
    auto d = OpenDataset(e.name);  // also reports what kept .shardcache from opening
    if (d.ok()) {
      out->push_back(SummarizeDataset(**d));
    } else if (d.status().code() != StatusCode::kNotFound) {
      SC_LOG_RATE_LIMITED(spdlog::level::warn, "skipping dataset '{}': {}", e.name, d.status().ToString());
    }
  }
  return Status::Ok();
}

Result<std::string> FileSource::GetSampleIndex(const DatasetPtr& d, uint32_t shard) {
  SC_RETURN_IF_ERROR(CheckDatasetName(d->name));
  if (shard >= static_cast<uint32_t>(d->manifest.shards_size())) {
    return InvalidArgument("dataset '" + d->name + "' has " +
                           std::to_string(d->manifest.shards_size()) + " shards; shard " +
                           std::to_string(shard) + " does not exist");
  }
  const std::string rel = d->name + "/" + dataset::kMetaDirName + "/samples/" +
                          std::to_string(shard) + ".pb";
  SC_ASSIGN_OR_RETURN(UniqueFd fd, OpenBeneath(rel, O_RDONLY));
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return ErrnoStatus(errno, "stat " + root_ + "/" + rel);
  std::string bytes(static_cast<size_t>(st.st_size), '\0');
  SC_RETURN_IF_ERROR(PreadFull(fd.get(), bytes.data(), bytes.size(), 0, root_ + "/" + rel));
  auto parsed = dataset::ParseSampleIndex(bytes, d->manifest, shard, root_ + "/" + rel);
  if (!parsed.ok()) return parsed.status();
  return bytes;
}

Status FileSource::ReadChunks(const DatasetPtr& d, uint32_t shard, uint64_t first, uint64_t count,
                              const ReadOptions& options, const ChunkSink& sink) {
  SC_RETURN_IF_ERROR(CheckDatasetName(d->name));
  SC_RETURN_IF_ERROR(CheckChunkRange(d, shard, first, count));
  SC_ASSIGN_OR_RETURN(UniqueFd fd, OpenShard(*d, shard));
  const auto& m = d->manifest;
  const std::string& path = m.shards(static_cast<int>(shard)).path();
  const uint64_t begin = first * m.chunk_bytes();
  ::posix_fadvise(fd.get(), static_cast<off_t>(begin),
                  static_cast<off_t>(count * m.chunk_bytes()), POSIX_FADV_SEQUENTIAL);
  for (uint64_t c = first; c < first + count; ++c) {
    if (std::chrono::steady_clock::now() > options.deadline) {
      return DeadlineExceeded("reading chunk " + std::to_string(c) + " of " + root_ + "/" +
                              d->name + "/" + path + ": deadline passed");
    }
    const uint64_t len = dataset::ChunkLength(m, shard, c);
    const uint64_t offset = c * m.chunk_bytes();
    auto chunk = std::make_shared<Chunk>();
    chunk->bytes = AlignedBuffer(len);
    SC_RETURN_IF_ERROR(PreadFull(fd.get(), chunk->bytes.data(), len, offset,
                                 root_ + "/" + d->name + "/" + path));
    FileReadBytes()->Add(len);
    chunk->hash = ChunkDigest(chunk->bytes.data(), len);
    const Hash128 want = dataset::ChunkHash(m, shard, c);
    if (chunk->hash != want) {
      ChecksumFailures()->Add();
      const std::string msg = root_ + "/" + d->name + "/" + path + " (dataset '" + d->name +
                              "', shard " + std::to_string(shard) + ", chunk " + std::to_string(c) +
                              ", offset " + std::to_string(offset) + ", " + std::to_string(len) +
                              " bytes): xxh3-128 is " + chunk->hash.ToHex() +
                              ", the manifest says " + want.ToHex();
      SC_LOG_RATE_LIMITED(spdlog::level::err, "corrupt chunk: {}", msg);
      return DataLoss(msg);
    }
    SC_RETURN_IF_ERROR(sink(c, chunk));
  }
  return Status::Ok();
}

Result<BlockTablePtr> FileSource::StoredTable(const dataset::Dataset& d, uint32_t shard, uint64_t chunk) const {
  const auto& m = d.manifest;
  const std::string rel = d.name + "/" + dataset::BlockTablesRelPath(shard);
  SC_ASSIGN_OR_RETURN(UniqueFd fd, OpenBeneath(rel, O_RDONLY));
  const dataset::BlockTableSpan at = dataset::BlockTableAt(m, shard, chunk);
  std::string table(at.length, '\0');
  SC_RETURN_IF_ERROR(PreadFull(fd.get(), table.data(), table.size(), at.offset, root_ + "/" + rel));
  SC_RETURN_IF_ERROR(CheckBlockTable(table, dataset::ChunkLength(m, shard, chunk), dataset::ChunkHash(m, shard, chunk),
                                     root_ + "/" + rel));
  return std::make_shared<const std::string>(std::move(table));
}

Result<BlockRange> FileSource::ReadBlocks(const DatasetPtr& d, uint32_t shard, uint64_t chunk,
                                          uint32_t first_block, uint32_t block_count, bool want_table,
                                          const ReadOptions& options) {
  const ChunkKey key{VersionId(d->version), shard, chunk};
  BlockTablePtr table = tables_.Get(key);
  if (!table) {
    auto stored = StoredTable(*d, shard, chunk);
    if (stored.ok()) {
      table = std::move(*stored);
      tables_.Put(key, table);
    } else {
      SC_LOG_RATE_LIMITED(spdlog::level::debug, "block table of chunk {} of shard {} of '{}' not stored: {}", chunk,
                          shard, d->name, stored.status().ToString());
    }
  }
  if (!table) {
    // The first range of this chunk: verify it whole, remember its table, slice.
    SC_ASSIGN_OR_RETURN(BlockRange whole, ChunkSource::ReadBlocks(d, shard, chunk, first_block, block_count,
                                                                  /*want_table=*/true, options));
    tables_.Put(key, std::make_shared<const std::string>(whole.table));
    if (!want_table) whole.table.clear();
    return whole;
  }
  SC_RETURN_IF_ERROR(CheckDatasetName(d->name));
  SC_ASSIGN_OR_RETURN(UniqueFd fd, OpenShard(*d, shard));
  const auto& m = d->manifest;
  const uint64_t length = dataset::ChunkLength(m, shard, chunk);
  BlockRange r;
  const uint64_t begin = std::min<uint64_t>(length, uint64_t{first_block} * kChunkBlockBytes);
  r.size = std::min<uint64_t>(length - begin, uint64_t{block_count} * kChunkBlockBytes);
  auto bytes = std::make_shared<Chunk>();
  bytes->bytes = AlignedBuffer(r.size);
  const std::string path = root_ + "/" + d->name + "/" + m.shards(static_cast<int>(shard)).path();
  const uint64_t offset = chunk * m.chunk_bytes() + begin;
  SC_RETURN_IF_ERROR(PreadFull(fd.get(), bytes->bytes.data(), r.size, offset, path));
  FileReadBytes()->Add(r.size);
  Status ok = CheckBlocks(*table, first_block, bytes->bytes.data(), r.size,
                          path + " (dataset '" + d->name + "', shard " + std::to_string(shard) + ", chunk " +
                              std::to_string(chunk) + ", offset " + std::to_string(offset) + ")");
  if (!ok.ok()) {
    ChecksumFailures()->Add();
    SC_LOG_RATE_LIMITED(spdlog::level::err, "corrupt block: {}", ok.message());
    return ok;
  }
  bytes->hash = dataset::ChunkHash(m, shard, chunk);
  r.bytes = std::move(bytes);
  if (want_table) r.table = *table;
  return r;
}

}  // namespace shardcache::upstream
