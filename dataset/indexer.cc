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
#include "common/hash.h"
#include "dataset/byte_source.h"
#include "dataset/dataset_name.h"
#include "dataset/megatron_format.h"
#include "dataset/parallel_for.h"
#include "dataset/records_format.h"
#include "dataset/tar_format.h"
#include "dataset/utf8.h"

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

struct ShardFile {
  std::string path;            // relative, '/'-separated
  std::string companion_path;  // megatron .idx, relative
  uint64_t size_bytes = 0;
};

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

Result<std::vector<ShardFile>> FindShards(const std::string& dir, v1::ShardFormat format) {
  std::vector<ShardFile> shards;
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
    const std::string abs = p.string();
    if (!IsValidUtf8(rel)) {
      return InvalidArgument(abs + ": shard path is not valid UTF-8, which manifests require; "
                             "rename the file");
    }
    ShardFile f;
    f.path = rel;
    switch (format) {
      case v1::RECORDS:
        break;
      case v1::TAR:
        if (EndsWith(rel, ".tar.gz") || EndsWith(rel, ".tgz")) {
          return InvalidArgument(
              abs + ": gzip-compressed tar shards cannot be served (a chunk of a compressed "
                    "stream cannot be read or verified on its own); decompress them with `gunzip` "
                    "(which leaves a .tar) and index again, or extract them and run `shardctl pack`");
        }
        if (!EndsWith(rel, ".tar")) continue;
        break;
      case v1::MEGATRON: {
        if (!EndsWith(rel, ".bin")) continue;
        const std::string idx_rel = rel.substr(0, rel.size() - 4) + ".idx";
        struct stat st;
        if (::stat((dir + "/" + idx_rel).c_str(), &st) != 0 || !S_ISREG(st.st_mode)) {
          return NotFound(dir + "/" + rel + ": megatron .bin has no matching index " + dir + "/" +
                          idx_rel);
        }
        f.companion_path = idx_rel;
        break;
      }
      default:
        return InvalidArgument("shard format must be records, tar or megatron");
    }
    struct stat st;
    if (::stat(abs.c_str(), &st) != 0) return ErrnoStatus(errno, "stat " + abs);
    f.size_bytes = static_cast<uint64_t>(st.st_size);
    shards.push_back(std::move(f));
  }
  std::sort(shards.begin(), shards.end(),
            [](const ShardFile& a, const ShardFile& b) { return a.path < b.path; });
  if (shards.empty()) {
    return NotFound(dir + ": no " + std::string(ShardFormatName(format)) + " shard files found");
  }
  return shards;
}

struct ShardResult {
  v1::SampleIndex samples;
  uint8_t dtype_code = 0;  // megatron
  std::string chunk_hashes;  // 16 bytes per chunk, filled by hashing tasks
};

Status IndexOneShard(const std::string& dir, const ShardFile& f, const IndexOptions& o,
                     ShardResult* out) {
  const std::string abs = dir + "/" + f.path;
  switch (o.format) {
    case v1::RECORDS: {
      SC_ASSIGN_OR_RETURN(out->samples, IndexRecordsShard(abs, f.size_bytes, o.record_bytes));
      return Status::Ok();
    }
    case v1::TAR: {
      SC_ASSIGN_OR_RETURN(auto src, FileByteSource::Open(abs));
      if (src->size() != f.size_bytes) {
        return FailedPrecondition(abs + ": size changed while indexing");
      }
      SC_ASSIGN_OR_RETURN(out->samples, IndexTarShard(*src));
      return Status::Ok();
    }
    case v1::MEGATRON: {
      const std::string idx_abs = dir + "/" + f.companion_path;
      SC_ASSIGN_OR_RETURN(std::string idx_bytes, ReadFileToString(idx_abs));
      SC_ASSIGN_OR_RETURN(MegatronIndex mi,
                          ParseMegatronIndex(idx_bytes, idx_abs, f.size_bytes, abs));
      out->samples = std::move(mi.samples);
      out->dtype_code = mi.dtype_code;
      return Status::Ok();
    }
    default:
      return InvalidArgument("shard format must be records, tar or megatron");
  }
}

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
  if (options.chunk_bytes < kMinChunkBytes || options.chunk_bytes > kMaxChunkBytes) {
    return InvalidArgument("chunk size " + std::to_string(options.chunk_bytes) +
                           " bytes is outside [" + std::to_string(kMinChunkBytes) + ", " +
                           std::to_string(kMaxChunkBytes) + "]");
  }
  if (options.format == v1::RECORDS && options.record_bytes == 0) {
    return InvalidArgument("records format needs a record size (--record-bytes)");
  }
  struct stat dst;
  if (::stat(dir.c_str(), &dst) != 0) return ErrnoStatus(errno, "dataset directory " + dir);
  if (!S_ISDIR(dst.st_mode)) return InvalidArgument(dir + " is not a directory");
  SC_ASSIGN_OR_RETURN(const std::string name, DatasetName(dir, options.name));

  SC_ASSIGN_OR_RETURN(std::vector<ShardFile> shards, FindShards(dir, options.format));
  const unsigned threads = DefaultThreads(options.threads);
  std::vector<ShardResult> results(shards.size());

  // Phase 1: sample indexes, one task per shard.
  SC_RETURN_IF_ERROR(ParallelFor(shards.size(), threads, [&](uint64_t i) {
    return IndexOneShard(dir, shards[i], options, &results[i]);
  }));

  // Phase 2: chunk hashes, one task per chunk across all shards, so one big shard still uses
  // every core. chunk_start[i] = first global chunk number of shard i.
  const uint64_t chunk_bytes = options.chunk_bytes;
  std::vector<uint64_t> chunk_start(shards.size() + 1, 0);
  uint64_t total_bytes = 0;
  for (size_t i = 0; i < shards.size(); ++i) {
    const uint64_t chunks = (shards[i].size_bytes + chunk_bytes - 1) / chunk_bytes;
    chunk_start[i + 1] = chunk_start[i] + chunks;
    results[i].chunk_hashes.assign(chunks * 16, '\0');
    total_bytes += shards[i].size_bytes;
  }
  std::atomic<uint64_t> done_bytes{0};
  auto hash_chunk = [&](uint64_t global) -> Status {
    const size_t i = static_cast<size_t>(
        std::upper_bound(chunk_start.begin(), chunk_start.end(), global) - chunk_start.begin() - 1);
    const uint64_t chunk = global - chunk_start[i];
    const uint64_t offset = chunk * chunk_bytes;
    const uint64_t length = std::min(chunk_bytes, shards[i].size_bytes - offset);
    const std::string abs = dir + "/" + shards[i].path;
    // One buffer per worker thread; the workers end with ParallelFor, freeing it.
    thread_local std::unique_ptr<char[]> buf;
    thread_local uint64_t buf_bytes = 0;
    if (buf_bytes < length) {
      buf.reset(new char[length]);
      buf_bytes = length;
    }
    SC_ASSIGN_OR_RETURN(UniqueFd fd, OpenFile(abs, O_RDONLY));
    Status s = PreadFull(fd.get(), buf.get(), length, offset, abs);
    if (!s.ok()) return DataLoss(abs + ": shard shrank while hashing: " + s.message());
    const std::string h = ChunkDigest(buf.get(), length).ToBytes();
    // Tasks write disjoint 16-byte slots of a string sized before the workers started.
    std::memcpy(results[i].chunk_hashes.data() + chunk * 16, h.data(), 16);
    done_bytes.fetch_add(length, std::memory_order_relaxed);
    return Status::Ok();
  };
  std::function<void()> tick;
  if (options.progress) {
    tick = [&] { options.progress(done_bytes.load(std::memory_order_relaxed), total_bytes); };
  }
  SC_RETURN_IF_ERROR(ParallelFor(chunk_start.back(), threads, hash_chunk, tick));

  // Phase 3: write sample indexes, then the manifest. The sample indexes are written without a
  // per-file fsync (12 ms each: minutes for thousands of shards) and made durable by one
  // syncfs() before the manifest that references them is written atomically.
  const std::string meta = dir + "/" + kMetaDirName;
  SC_RETURN_IF_ERROR(MakeDirs(meta + "/samples"));
  v1::Manifest m;
  m.set_format_version(kManifestFormatVersion);
  m.set_block_bytes(kChunkBlockBytes);
  m.set_name(name);
  m.set_format(options.format);
  m.set_chunk_bytes(chunk_bytes);
  if (options.format == v1::RECORDS) m.set_record_bytes(options.record_bytes);
  std::vector<std::string> index_hashes(shards.size());
  SC_RETURN_IF_ERROR(ParallelFor(shards.size(), threads, [&](uint64_t i) -> Status {
    ShardResult& r = results[i];
    r.samples.set_format_version(kSampleIndexFormatVersion);
    std::string bytes;
    if (!r.samples.SerializeToString(&bytes)) {
      return Internal(dir + "/" + shards[i].path + ": cannot serialize its sample index");
    }
    index_hashes[i] = HashBytes(bytes).ToBytes();
    return WriteFileUnsynced(SampleIndexPath(dir, static_cast<uint32_t>(i)), bytes);
  }));
  {
    SC_ASSIGN_OR_RETURN(UniqueFd meta_fd, OpenFile(meta + "/samples", O_RDONLY | O_DIRECTORY));
    if (::syncfs(meta_fd.get()) != 0) return ErrnoStatus(errno, "syncfs " + meta);
  }
  uint64_t total_samples = 0;
  for (size_t i = 0; i < shards.size(); ++i) {
    ShardResult& r = results[i];
    if (options.format == v1::MEGATRON) {
      if (m.megatron_dtype() == 0) {
        m.set_megatron_dtype(r.dtype_code);
        m.set_megatron_dtype_bytes(MegatronDtypeBytes(r.dtype_code));
      }
      if (m.megatron_dtype() != r.dtype_code) {
        return InvalidArgument(dir + "/" + shards[i].companion_path + ": dtype " +
                               MegatronDtypeName(r.dtype_code) + " differs from " +
                               MegatronDtypeName(static_cast<uint8_t>(m.megatron_dtype())) +
                               " of the first shard; a dataset has one token type");
      }
    }
    v1::Shard* s = m.add_shards();
    s->set_path(shards[i].path);
    s->set_size_bytes(shards[i].size_bytes);
    s->set_sample_count(static_cast<uint64_t>(r.samples.offsets_size()));
    s->set_chunk_hashes(std::move(r.chunk_hashes));
    s->set_companion_path(shards[i].companion_path);
    s->set_sample_index_hash(index_hashes[i]);
    total_samples += s->sample_count();
  }
  m.set_total_samples(total_samples);
  m.set_total_bytes(total_bytes);
  // Sample indexes left over from an earlier index with more shards.
  for (size_t i = shards.size();; ++i) {
    const std::string stale = SampleIndexPath(dir, static_cast<uint32_t>(i));
    if (::unlink(stale.c_str()) != 0) break;
  }
  std::string manifest_bytes;
  if (!m.SerializeToString(&manifest_bytes)) {
    return Internal(dir + ": cannot serialize the manifest");
  }
  SC_RETURN_IF_ERROR(WriteFileAtomic(ManifestPath(dir), manifest_bytes));
  spdlog::debug("indexed {}: {} shards, {} samples, {} bytes, version {}", dir, shards.size(),
               total_samples, total_bytes, ManifestVersion(manifest_bytes));
  return LoadDatasetDir(dir);
}

}  // namespace shardcache::dataset
