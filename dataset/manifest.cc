#include "dataset/manifest.h"

#include <sys/stat.h>

#include "common/fs.h"

namespace shardcache::dataset {

std::string ManifestPath(const std::string& dataset_dir) {
  return dataset_dir + "/" + kMetaDirName + "/manifest.pb";
}

std::string SampleIndexPath(const std::string& dataset_dir, uint32_t shard) {
  return dataset_dir + "/" + kMetaDirName + "/samples/" + std::to_string(shard) + ".pb";
}

std::string BlockTablesRelPath(uint32_t shard) {
  return std::string(kMetaDirName) + "/blocks/" + std::to_string(shard) + ".bin";
}

std::string BlockTablesPath(const std::string& dataset_dir, uint32_t shard) {
  return dataset_dir + "/" + BlockTablesRelPath(shard);
}

BlockTableSpan BlockTableAt(const v1::Manifest& m, uint32_t shard, uint64_t chunk) {
  return {chunk * BlockTableStride(m.chunk_bytes()), ChunkBlockCount(ChunkLength(m, shard, chunk)) * kBlockHashBytes};
}

std::string ManifestVersion(std::string_view manifest_bytes) {
  return HashBytes(manifest_bytes).ToHex();
}

uint64_t ChunkCount(const v1::Manifest& m, uint32_t shard) {
  const uint64_t size = m.shards(static_cast<int>(shard)).size_bytes();
  return (size + m.chunk_bytes() - 1) / m.chunk_bytes();
}

uint64_t ChunkLength(const v1::Manifest& m, uint32_t shard, uint64_t chunk) {
  const uint64_t size = m.shards(static_cast<int>(shard)).size_bytes();
  const uint64_t begin = chunk * m.chunk_bytes();
  return std::min<uint64_t>(m.chunk_bytes(), size - begin);
}

Hash128 ChunkHash(const v1::Manifest& m, uint32_t shard, uint64_t chunk) {
  return Hash128::FromBytes(
      std::string_view(m.shards(static_cast<int>(shard)).chunk_hashes()).substr(chunk * 16, 16));
}

namespace {

bool SafeRelativePath(const std::string& p) {
  if (p.empty() || p[0] == '/') return false;
  size_t start = 0;
  while (start <= p.size()) {
    size_t end = p.find('/', start);
    if (end == std::string::npos) end = p.size();
    const std::string part = p.substr(start, end - start);
    if (part.empty() || part == "." || part == "..") return false;
    start = end + 1;
  }
  return true;
}

}  // namespace

Result<v1::Manifest> ParseManifest(std::string_view bytes, const std::string& where) {
  v1::Manifest m;
  if (!m.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
    return DataLoss(where + ": manifest is not a valid serialized shardcache.v1.Manifest (" +
                    std::to_string(bytes.size()) + " bytes)");
  }
  if (m.format_version() == 1) {
    return FailedPrecondition(where + ": manifest format version 1 was written by an older shardctl and is no "
                              "longer served (format 2 hashes each chunk as a Merkle root over 16 KiB blocks, so "
                              "parts of a chunk can be fetched and verified); re-run `shardctl index` on the "
                              "dataset directory to write a format-2 manifest");
  }
  if (m.format_version() != kManifestFormatVersion) {
    return FailedPrecondition(where + ": manifest format version " +
                              std::to_string(m.format_version()) + " is not supported (expected " +
                              std::to_string(kManifestFormatVersion) + ")");
  }
  if (m.block_bytes() != kChunkBlockBytes) {
    return InvalidArgument(where + ": block_bytes " + std::to_string(m.block_bytes()) + " is not supported (expected " +
                           std::to_string(kChunkBlockBytes) + ")");
  }
  if (m.name().empty()) return InvalidArgument(where + ": manifest has no dataset name");
  if (m.chunk_bytes() < kMinChunkBytes || m.chunk_bytes() > kMaxChunkBytes) {
    return InvalidArgument(where + ": chunk_bytes " + std::to_string(m.chunk_bytes()) +
                           " is outside [" + std::to_string(kMinChunkBytes) + ", " +
                           std::to_string(kMaxChunkBytes) + "]");
  }
  if (m.format() == v1::RECORDS && m.record_bytes() == 0) {
    return InvalidArgument(where + ": records dataset without record_bytes");
  }
  uint64_t samples = 0, bytes_total = 0;
  for (int i = 0; i < m.shards_size(); ++i) {
    const auto& s = m.shards(i);
    const std::string shard_where = where + ": shard " + std::to_string(i) + " ('" + s.path() + "')";
    if (!SafeRelativePath(s.path())) {
      return InvalidArgument(shard_where + ": path must be relative without '..'");
    }
    if (!s.companion_path().empty() && !SafeRelativePath(s.companion_path())) {
      return InvalidArgument(shard_where + ": companion path must be relative without '..'");
    }
    const uint64_t chunks = (s.size_bytes() + m.chunk_bytes() - 1) / m.chunk_bytes();
    if (s.chunk_hashes().size() != chunks * 16) {
      return InvalidArgument(shard_where + ": has " + std::to_string(s.chunk_hashes().size() / 16) +
                             " chunk hashes for " + std::to_string(chunks) + " chunks");
    }
    if (m.format() == v1::RECORDS && s.sample_count() * m.record_bytes() != s.size_bytes()) {
      return InvalidArgument(shard_where + ": size " + std::to_string(s.size_bytes()) +
                             " is not sample_count x record_bytes");
    }
    samples += s.sample_count();
    bytes_total += s.size_bytes();
  }
  if (samples != m.total_samples() || bytes_total != m.total_bytes()) {
    return InvalidArgument(where + ": totals (" + std::to_string(m.total_samples()) + " samples, " +
                           std::to_string(m.total_bytes()) + " bytes) do not match its shards (" +
                           std::to_string(samples) + ", " + std::to_string(bytes_total) + ")");
  }
  return m;
}

Result<v1::SampleIndex> ParseSampleIndex(std::string_view bytes, const v1::Manifest& m,
                                         uint32_t shard, const std::string& where) {
  if (shard >= static_cast<uint32_t>(m.shards_size())) {
    return InvalidArgument(where + ": shard " + std::to_string(shard) + " does not exist (dataset has " +
                           std::to_string(m.shards_size()) + ")");
  }
  const auto& s = m.shards(static_cast<int>(shard));
  if (!s.sample_index_hash().empty() &&
      HashBytes(bytes).ToBytes() != s.sample_index_hash()) {
    return DataLoss(where + ": sample index of shard " + std::to_string(shard) +
                    " does not match the hash in the manifest");
  }
  v1::SampleIndex idx;
  if (!idx.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
    return DataLoss(where + ": sample index of shard " + std::to_string(shard) + " is malformed");
  }
  if (idx.offsets_size() != idx.lengths_size() ||
      static_cast<uint64_t>(idx.offsets_size()) != s.sample_count()) {
    return DataLoss(where + ": sample index of shard " + std::to_string(shard) + " has " +
                    std::to_string(idx.offsets_size()) + " entries, manifest says " +
                    std::to_string(s.sample_count()));
  }
  for (int i = 0; i < idx.offsets_size(); ++i) {
    if (idx.offsets(i) + idx.lengths(i) > s.size_bytes() || idx.offsets(i) + idx.lengths(i) < idx.offsets(i)) {
      return DataLoss(where + ": sample " + std::to_string(i) + " of shard " + std::to_string(shard) +
                      " lies outside the shard (offset " + std::to_string(idx.offsets(i)) + ")");
    }
  }
  return idx;
}

Result<DatasetPtr> MakeDataset(std::string manifest_bytes, const std::string& where,
                               std::string served_name) {
  SC_ASSIGN_OR_RETURN(v1::Manifest m, ParseManifest(manifest_bytes, where));
  auto d = std::make_shared<Dataset>();
  d->name = served_name.empty() ? m.name() : std::move(served_name);
  d->version = ManifestVersion(manifest_bytes);
  d->manifest = std::move(m);
  d->manifest_bytes = std::move(manifest_bytes);
  return DatasetPtr(std::move(d));
}

Result<DatasetPtr> LoadDatasetDir(const std::string& dataset_dir) {
  const std::string path = ManifestPath(dataset_dir);
  SC_ASSIGN_OR_RETURN(std::string bytes, ReadFileToString(path));
  SC_ASSIGN_OR_RETURN(DatasetPtr d, MakeDataset(std::move(bytes), path));
  for (const auto& s : d->manifest.shards()) {
    const std::string file = dataset_dir + "/" + s.path();
    struct stat st;
    if (::stat(file.c_str(), &st) != 0) {
      return FailedPrecondition(path + ": shard file " + file + " is missing");
    }
    if (static_cast<uint64_t>(st.st_size) != s.size_bytes()) {
      return FailedPrecondition(path + ": shard file " + file + " has " + std::to_string(st.st_size) +
                                " bytes, manifest says " + std::to_string(s.size_bytes()));
    }
  }
  return d;
}

Result<v1::SampleIndex> LoadSampleIndex(const std::string& dataset_dir, const v1::Manifest& m,
                                        uint32_t shard) {
  const std::string path = SampleIndexPath(dataset_dir, shard);
  SC_ASSIGN_OR_RETURN(std::string bytes, ReadFileToString(path));
  return ParseSampleIndex(bytes, m, shard, path);
}

}  // namespace shardcache::dataset
