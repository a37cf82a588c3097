#include "daemon/source/chunk_source.h"

#include <algorithm>
#include <cstring>
#include <map>

#include "common/hash.h"

namespace shardcache {

Result<ChunkPtr> ChunkSource::ReadChunk(const DatasetPtr& dataset, uint32_t shard, uint64_t chunk,
                                        const ReadOptions& options) {
  ChunkPtr out;
  Status s = ReadChunks(dataset, shard, chunk, 1, options, [&](uint64_t, const ChunkPtr& c) {
    out = c;
    return Status::Ok();
  });
  if (!s.ok()) return s;
  return out;
}

Status ChunkSource::ReadPieces(const DatasetPtr& dataset, uint32_t shard,
                               std::span<const ChunkPiece> pieces, const ReadOptions& options) {
  if (pieces.empty()) return Status::Ok();
  // Pieces by chunk, in chunk order; consecutive chunks form one ReadChunks call.
  std::map<uint64_t, std::vector<const ChunkPiece*>> by_chunk;
  for (const ChunkPiece& p : pieces) by_chunk[p.chunk].push_back(&p);
  auto it = by_chunk.begin();
  while (it != by_chunk.end()) {
    const uint64_t first = it->first;
    uint64_t count = 1;
    auto next = std::next(it);
    while (next != by_chunk.end() && next->first == first + count) {
      ++count;
      ++next;
    }
    SC_RETURN_IF_ERROR(ReadChunks(dataset, shard, first, count, options,
                                  [&](uint64_t c, const ChunkPtr& chunk) -> Status {
                                    auto found = by_chunk.find(c);
                                    if (found == by_chunk.end()) return Status::Ok();
                                    for (const ChunkPiece* p : found->second) {
                                      SC_RETURN_IF_ERROR(CheckPiece(dataset, shard, *p, chunk->bytes.size()));
                                      std::memcpy(p->dest, chunk->bytes.data() + p->offset, p->length);
                                    }
                                    return Status::Ok();
                                  }));
    it = next;
  }
  return Status::Ok();
}

Result<BlockRange> ChunkSource::ReadBlocks(const DatasetPtr& dataset, uint32_t shard, uint64_t chunk,
                                           uint32_t first_block, uint32_t block_count, bool want_table,
                                           const ReadOptions& options) {
  SC_ASSIGN_OR_RETURN(ChunkPtr whole, ReadChunk(dataset, shard, chunk, options));
  BlockRange r;
  const uint64_t size = whole->bytes.size();
  r.offset = std::min<uint64_t>(size, uint64_t{first_block} * kChunkBlockBytes);
  r.size = std::min<uint64_t>(size - r.offset, uint64_t{block_count} * kChunkBlockBytes);
  if (want_table) r.table = BlockTable(whole->bytes.data(), size);
  r.bytes = std::move(whole);
  return r;
}

Status ChunkSource::Prefetch(const DatasetPtr& dataset, uint32_t shard, uint64_t first, uint64_t count,
                             const ReadOptions& options) {
  return ReadChunks(dataset, shard, first, count, options,
                    [](uint64_t, const ChunkPtr&) { return Status::Ok(); });
}

bool ChunkSource::ReadPiecesFromMemory(const DatasetPtr&, uint32_t, std::span<const ChunkPiece>,
                                       FetchPriority) {
  return false;
}

bool ChunkSource::Holds(const DatasetPtr&, uint32_t, uint64_t, uint64_t) { return false; }
bool ChunkSource::HoldsPieces(const DatasetPtr&, uint32_t, std::span<const ChunkPiece>) { return false; }

Status CheckPiece(const DatasetPtr& dataset, uint32_t shard, const ChunkPiece& piece, uint64_t chunk_length) {
  if (piece.offset > chunk_length || piece.length > chunk_length - piece.offset) {
    return InvalidArgument("bytes [" + std::to_string(piece.offset) + ", " +
                           std::to_string(piece.offset + piece.length) + ") lie outside chunk " +
                           std::to_string(piece.chunk) + " of shard " + std::to_string(shard) + " of '" +
                           dataset->name + "', which has " + std::to_string(chunk_length) + " bytes");
  }
  return Status::Ok();
}

Status CheckChunkRange(const DatasetPtr& dataset, uint32_t shard, uint64_t first, uint64_t count) {
  const auto& m = dataset->manifest;
  if (shard >= static_cast<uint32_t>(m.shards_size())) {
    return InvalidArgument("dataset '" + dataset->name + "' has " + std::to_string(m.shards_size()) +
                           " shards; shard " + std::to_string(shard) + " does not exist");
  }
  const uint64_t chunks = dataset::ChunkCount(m, shard);
  if (count == 0 || first >= chunks || count > chunks - first) {
    return InvalidArgument("chunk range [" + std::to_string(first) + ", " +
                           std::to_string(first + count) + ") is outside shard " +
                           std::to_string(shard) + " of '" + dataset->name + "', which has " +
                           std::to_string(chunks) + " chunks");
  }
  return Status::Ok();
}

v1::DatasetSummary SummarizeDataset(const dataset::Dataset& d) {
  v1::DatasetSummary s;
  s.set_name(d.name);
  s.set_version(d.version);
  s.set_format(d.manifest.format());
  s.set_total_bytes(d.manifest.total_bytes());
  s.set_total_samples(d.manifest.total_samples());
  s.set_shard_count(static_cast<uint32_t>(d.manifest.shards_size()));
  return s;
}

}  // namespace shardcache
