// ObjectSource's reads of pieces: the blocks that cover them, verified against stored block
// tables (object_source.h).
#include <algorithm>
#include <cstring>

#include <spdlog/spdlog.h>

#include "common/log.h"
#include "daemon/upstream/object_source.h"
#include "dataset/manifest.h"
#include "objstore/objstore_metrics.h"

namespace shardcache::upstream {

std::vector<BlockTablePtr> ObjectSource::TablesOf(const DatasetPtr& d, uint32_t shard,
                                                  const std::vector<uint64_t>& chunks, bool urgent) {
  const auto& m = d->manifest;
  const Hash128 vid = VersionId(d->version);
  const std::string shard_id = d->version + "/" + std::to_string(shard);
  const std::string key = DatasetKey(d->name, dataset::BlockTablesRelPath(shard));
  std::vector<BlockTablePtr> out(chunks.size());
  std::vector<objstore::RangeRead> reads;
  std::vector<size_t> read_for;  // index into chunks of each read
  {
    MutexLock lock(&mu_);
    if (no_tables_.count(shard_id)) return out;
  }
  for (size_t i = 0; i < chunks.size(); ++i) {
    out[i] = tables_.Get(ChunkKey{vid, shard, chunks[i]});
    if (out[i]) continue;
    const uint64_t length = ChunkBlockCount(dataset::ChunkLength(m, shard, chunks[i])) * kBlockHashBytes;
    reads.push_back({key, chunks[i] * dataset::BlockTableStride(m.chunk_bytes()), length, "", objstore::kUnknownSize,
                     nullptr, urgent});
    read_for.push_back(i);
  }
  if (reads.empty()) return out;
  std::vector<Result<std::string>> got = client_->ReadRanges(reads);
  for (size_t r = 0; r < got.size(); ++r) {
    const size_t i = read_for[r];
    Status s = got[r].status();
    if (s.ok()) {
      s = CheckBlockTable(*got[r], dataset::ChunkLength(m, shard, chunks[i]), dataset::ChunkHash(m, shard, chunks[i]),
                          client_->uri().Describe(key));
    }
    if (!s.ok()) {
      if (s.code() == StatusCode::kNotFound) {
        MutexLock lock(&mu_);
        no_tables_.insert(shard_id);
      }
      SC_LOG_RATE_LIMITED(spdlog::level::info, "block table of chunk {} of shard {} of '{}' not usable, reading whole chunks: {}",
                          chunks[i], shard, d->name, s.ToString());
      continue;
    }
    out[i] = std::make_shared<const std::string>(std::move(*got[r]));
    tables_.Put(ChunkKey{vid, shard, chunks[i]}, out[i]);
  }
  return out;
}

Status ObjectSource::ReadPieces(const DatasetPtr& d, uint32_t shard, std::span<const ChunkPiece> pieces,
                                const ReadOptions& options) {
  SC_RETURN_IF_ERROR(CheckChunkRange(d, shard, 0, dataset::ChunkCount(d->manifest, shard)));
  const auto& m = d->manifest;
  std::vector<uint64_t> chunks;
  for (const ChunkPiece& p : pieces) {
    SC_RETURN_IF_ERROR(CheckPiece(d, shard, p, dataset::ChunkLength(m, shard, p.chunk)));
    chunks.push_back(p.chunk);
  }
  std::sort(chunks.begin(), chunks.end());
  chunks.erase(std::unique(chunks.begin(), chunks.end()), chunks.end());
  const bool urgent = options.priority == FetchPriority::kDemand;
  const std::vector<BlockTablePtr> tables = TablesOf(d, shard, chunks, urgent);
  auto table_of = [&](uint64_t c) {
    return tables[static_cast<size_t>(std::lower_bound(chunks.begin(), chunks.end(), c) - chunks.begin())];
  };

  // One ranged GET per piece: the blocks it touches, pinned to the shard object as opened.
  const objstore::ObjectStat state = ShardState(d, shard);
  const std::string key = DatasetKey(d->name, m.shards(static_cast<int>(shard)).path());
  std::vector<ChunkPiece> whole;
  std::vector<const ChunkPiece*> ranged;
  std::vector<objstore::RangeRead> reads;
  for (const ChunkPiece& p : pieces) {
    if (p.length == 0) continue;
    if (!table_of(p.chunk)) {
      whole.push_back(p);
      continue;
    }
    const uint64_t begin = p.offset / kChunkBlockBytes * kChunkBlockBytes;
    const uint64_t end = std::min(dataset::ChunkLength(m, shard, p.chunk),
                                  (p.offset + p.length + kChunkBlockBytes - 1) / kChunkBlockBytes * kChunkBlockBytes);
    reads.push_back({key, p.chunk * m.chunk_bytes() + begin, end - begin, state.etag, state.size, nullptr, urgent});
    ranged.push_back(&p);
  }
  std::vector<Result<std::string>> got = client_->ReadRanges(reads);
  for (size_t i = 0; i < got.size(); ++i) {
    SC_RETURN_IF_ERROR(got[i].status());
    const ChunkPiece& p = *ranged[i];
    const uint64_t first_block = p.offset / kChunkBlockBytes;
    const std::string& bytes = *got[i];
    Status ok = CheckBlocks(*table_of(p.chunk), first_block, reinterpret_cast<const uint8_t*>(bytes.data()),
                            bytes.size(),
                            client_->uri().Describe(key) + " (dataset '" + d->name + "', shard " +
                                std::to_string(shard) + ", chunk " + std::to_string(p.chunk) + ")");
    if (!ok.ok()) {
      objstore::ChecksumFailuresCounter()->Add();
      SC_LOG_RATE_LIMITED(spdlog::level::err, "corrupt block: {}", ok.message());
      return ok;
    }
    std::memcpy(p.dest, bytes.data() + (p.offset - first_block * kChunkBlockBytes), p.length);
  }
  if (whole.empty()) return Status::Ok();
  return ChunkSource::ReadPieces(d, shard, whole, options);
}

}  // namespace shardcache::upstream
