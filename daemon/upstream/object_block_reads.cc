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

bool ObjectSource::TablesMissing(const DatasetPtr& d, uint32_t shard) {
  MutexLock lock(&mu_);
  return no_tables_.count(d->version + "/" + std::to_string(shard)) > 0;
}

BlockTablePtr ObjectSource::AdoptTable(const DatasetPtr& d, uint32_t shard, uint64_t chunk, Result<std::string> got) {
  const auto& m = d->manifest;
  const std::string key = DatasetKey(d->name, dataset::BlockTablesRelPath(shard));
  Status s = got.status();
  if (s.ok()) {
    s = CheckBlockTable(*got, dataset::ChunkLength(m, shard, chunk), dataset::ChunkHash(m, shard, chunk),
                        client_->uri().Describe(key));
  }
  if (!s.ok()) {
    if (s.code() == StatusCode::kNotFound) {
      MutexLock lock(&mu_);
      no_tables_.insert(d->version + "/" + std::to_string(shard));
    }
    SC_LOG_RATE_LIMITED(spdlog::level::info, "block table of chunk {} of shard {} of '{}' not usable, reading whole chunks: {}",
                        chunk, shard, d->name, s.ToString());
    return nullptr;
  }
  auto table = std::make_shared<const std::string>(std::move(*got));
  tables_.Put(ChunkKey{VersionId(d->version), shard, chunk}, table);
  return table;
}

Status ObjectSource::ReadPieces(const DatasetPtr& d, uint32_t shard, std::span<const ChunkPiece> pieces,
                                const ReadOptions& options) {
  SC_RETURN_IF_ERROR(CheckChunkRange(d, shard, 0, dataset::ChunkCount(d->manifest, shard)));
  const auto& m = d->manifest;
  for (const ChunkPiece& p : pieces) SC_RETURN_IF_ERROR(CheckPiece(d, shard, p, dataset::ChunkLength(m, shard, p.chunk)));
  if (TablesMissing(d, shard)) return ChunkSource::ReadPieces(d, shard, pieces, options);
  const bool urgent = options.priority == FetchPriority::kDemand;
  const Hash128 vid = VersionId(d->version);

  // One concurrent go: the tables not known yet, and for each piece the blocks it touches,
  // pinned to the shard object as opened (fetched before their table is checked: a round trip
  // less for the first read of a chunk; unused if the table turns out missing or wrong).
  std::vector<uint64_t> chunks;
  for (const ChunkPiece& p : pieces) chunks.push_back(p.chunk);
  std::sort(chunks.begin(), chunks.end());
  chunks.erase(std::unique(chunks.begin(), chunks.end()), chunks.end());
  std::vector<BlockTablePtr> tables(chunks.size());
  std::vector<objstore::RangeRead> reads;
  const std::string tables_key = DatasetKey(d->name, dataset::BlockTablesRelPath(shard));
  std::vector<size_t> table_reads;  // chunk index of each table read (reads[0, size))
  for (size_t i = 0; i < chunks.size(); ++i) {
    tables[i] = tables_.Get(ChunkKey{vid, shard, chunks[i]});
    if (tables[i]) continue;
    const dataset::BlockTableSpan at = dataset::BlockTableAt(m, shard, chunks[i]);
    reads.push_back({tables_key, at.offset, at.length, "", objstore::kUnknownSize, nullptr, urgent});
    table_reads.push_back(i);
  }
  const objstore::ObjectStat state = ShardState(d, shard);
  const std::string key = DatasetKey(d->name, m.shards(static_cast<int>(shard)).path());
  std::vector<const ChunkPiece*> ranged;
  for (const ChunkPiece& p : pieces) {
    if (p.length == 0) continue;
    const uint64_t begin = p.offset / kChunkBlockBytes * kChunkBlockBytes;
    const uint64_t end = std::min(dataset::ChunkLength(m, shard, p.chunk),
                                  (p.offset + p.length + kChunkBlockBytes - 1) / kChunkBlockBytes * kChunkBlockBytes);
    reads.push_back({key, p.chunk * m.chunk_bytes() + begin, end - begin, state.etag, state.size, nullptr, urgent});
    ranged.push_back(&p);
  }
  std::vector<Result<std::string>> got = client_->ReadRanges(reads);
  for (size_t r = 0; r < table_reads.size(); ++r) {
    tables[table_reads[r]] = AdoptTable(d, shard, chunks[table_reads[r]], std::move(got[r]));
  }

  std::vector<ChunkPiece> whole;
  for (size_t i = 0; i < ranged.size(); ++i) {
    const ChunkPiece& p = *ranged[i];
    const BlockTablePtr& table =
        tables[static_cast<size_t>(std::lower_bound(chunks.begin(), chunks.end(), p.chunk) - chunks.begin())];
    if (!table) {
      whole.push_back(p);
      continue;
    }
    Result<std::string>& bytes = got[table_reads.size() + i];
    SC_RETURN_IF_ERROR(bytes.status());
    const uint64_t first_block = p.offset / kChunkBlockBytes;
    Status ok = CheckBlocks(*table, first_block, reinterpret_cast<const uint8_t*>(bytes->data()), bytes->size(),
                            client_->uri().Describe(key) + " (dataset '" + d->name + "', shard " +
                                std::to_string(shard) + ", chunk " + std::to_string(p.chunk) + ")");
    if (!ok.ok()) {
      objstore::ChecksumFailuresCounter()->Add();
      SC_LOG_RATE_LIMITED(spdlog::level::err, "corrupt block: {}", ok.message());
      return ok;
    }
    std::memcpy(p.dest, bytes->data() + (p.offset - first_block * kChunkBlockBytes), p.length);
  }
  if (whole.empty()) return Status::Ok();
  return ChunkSource::ReadPieces(d, shard, whole, options);
}

}  // namespace shardcache::upstream
