// ChunkSource: the one interface every tier of the fetch path implements.
//
//   FileSource (upstream = file://)   — reads a dataset directory; the origin role.
//   GrpcSource (upstream = grpc://)   — fetches from another shardcached over the network.
//   CachedSource (cache tiers)        — DRAM + NVMe in front of another ChunkSource.
//
// The Origin gRPC service serves any ChunkSource, and the local (trainer) service reads from
// one, so a node daemon, a city-local middle tier and the origin are the same program with a
// different upstream. Every chunk a ChunkSource hands out has been verified against its
// manifest hash *by that source* (end-to-end: a tier never trusts what it received).
//
// Thread safety: implementations are safe for concurrent use from any thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/fs.h"
#include "common/hash.h"
#include "common/status.h"
#include "daemon/source/chunk_key.h"
#include "dataset/dataset_name.h"
#include "dataset/manifest.h"
#include "shardcache/origin.pb.h"

namespace shardcache {

using dataset::DatasetPtr;

// Verified bytes of one chunk. Immutable once published; shared by every reader.
struct Chunk {
  AlignedBuffer bytes;   // bytes.size() == chunk length
  Hash128 hash;
};
using ChunkPtr = std::shared_ptr<const Chunk>;

enum class FetchPriority { kDemand = 0, kPrefetch = 1 };

struct ReadOptions {
  // Absolute deadline for the whole call. Default: 60 s from construction.
  std::chrono::steady_clock::time_point deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(60);
  FetchPriority priority = FetchPriority::kDemand;
  // ReadPieces only. false: a cache tier that misses fetches only the blocks covering the pieces
  // (the upstream's ReadPieces) and keeps none of them — for reads whose chunks no tier would
  // keep until their other samples are read (a global shuffle of a dataset larger than the
  // cache). true: misses fetch and keep whole chunks.
  bool whole_chunks = true;
  // ReadPieces with whole_chunks false, of a cache tier only (CapacityBytes() > 0): the caller
  // wants the pieces kept by the tiers (a warm read), not their bytes. Every ChunkPiece::dest is
  // null; pieces a tier holds are skipped, and misses land straight in the runs the tiers keep
  // (no scratch buffer, one copy less).
  bool keep_only = false;
  // false: the read came from another member of this daemon's peer group (peer_group.h); a
  // peer group sends it to this daemon's own upstream, never on to another member.
  bool via_peers = true;
  // ReadPieces only, optional: called on the reading thread with a piece's index (in `pieces`)
  // as soon as its bytes are verified in its dest, before ReadPieces returns, so that a cache
  // keeps it while the rest still travels. A source may call it for none of them.
  std::function<void(size_t)> piece_done;
};

// Receives chunks in order. Returning a non-OK status stops the read with that status.
using ChunkSink = std::function<Status(uint64_t chunk_index, const ChunkPtr& chunk)>;

// Bytes [offset, offset + length) of one chunk, to be copied to `dest` (see ReadPieces).
struct ChunkPiece {
  uint64_t chunk = 0;
  uint64_t offset = 0;  // within the chunk
  uint64_t length = 0;
  uint8_t* dest = nullptr;
};

// What ReadBlocks returns: the range is bytes [offset, offset + size) of `bytes` (the whole
// chunk where the source read it whole).
struct BlockRange {
  ChunkPtr bytes;
  uint64_t offset = 0, size = 0;
  std::string table;  // the chunk's block table, when asked for
};

class ChunkSource {
 public:
  virtual ~ChunkSource() = default;

  virtual Result<std::vector<v1::DatasetSummary>> ListDatasets() = 0;

  // The current manifest of dataset `name` (dataset_name.h: "laion/train" is directory
  // laion/train below the origin's root), with Dataset::name == `name`. NotFound for unknown
  // names, InvalidArgument for names CheckDatasetName refuses.
  virtual Result<DatasetPtr> OpenDataset(const std::string& name) = 0;

  // Serialized SampleIndex of one shard (validated against the manifest).
  virtual Result<std::string> GetSampleIndex(const DatasetPtr& dataset, uint32_t shard) = 0;

  // Delivers chunks [first, first + count) of `shard` to `sink` in order, each verified.
  // InvalidArgument when the range lies outside the shard; Unavailable / DeadlineExceeded when
  // the data cannot be had in time; DataLoss when it keeps failing verification.
  virtual Status ReadChunks(const DatasetPtr& dataset, uint32_t shard, uint64_t first,
                            uint64_t count, const ReadOptions& options, const ChunkSink& sink) = 0;

  // Copies pieces of chunks of `shard` to their destinations, every byte verified as this
  // source verifies whole chunks. Pieces may come in any order and several may share a chunk;
  // destinations must not overlap. The default reads the covered chunks with ReadChunks (runs
  // of consecutive chunks as one call) and copies; a cache tier overrides it to read only the
  // bytes asked for (CachedSource: sub-chunk reads from NVMe, straight into `dest` where
  // alignment allows). InvalidArgument when a piece lies outside its chunk.
  virtual Status ReadPieces(const DatasetPtr& dataset, uint32_t shard,
                            std::span<const ChunkPiece> pieces, const ReadOptions& options);

  // Blocks [first_block, first_block + block_count) of one chunk (16 KiB blocks, common/hash.h),
  // every byte verified, with the chunk's block table when `want_table` (it matches the
  // manifest's Merkle root). The caller has checked that the blocks lie inside the chunk. The
  // default reads the whole chunk with ReadChunks; a source that can verify blocks alone reads
  // only those (FileSource, once it knows the chunk's table).
  virtual Result<BlockRange> ReadBlocks(const DatasetPtr& dataset, uint32_t shard, uint64_t chunk,
                                        uint32_t first_block, uint32_t block_count, bool want_table,
                                        const ReadOptions& options);

  // Makes chunks [first, first + count) available in the tiers at and below this source without
  // handing them to anybody (the prefetcher's warm reads). The default reads them with
  // ReadChunks and drops them; a cache tier skips what it already holds.
  virtual Status Prefetch(const DatasetPtr& dataset, uint32_t shard, uint64_t first, uint64_t count,
                          const ReadOptions& options);

  // Non-blocking shortcuts for callers that would otherwise hand the work to another thread
  // (batch assembly): neither ever waits for a disk or the network.
  //
  // ReadPiecesFromMemory copies the pieces as ReadPieces would, but only when every one of
  // them is in memory right now (a cache's DRAM tier): true when it copied them all; false,
  // having copied nothing, otherwise (also for an invalid piece: ReadPieces reports that).
  // Holds is true when every chunk of [first, first + count) is held by a tier at or below this
  // source, so a Prefetch would have nothing to do. HoldsPieces is true when every piece's
  // bytes are held (its chunk, or the piece itself as a run), so ReadPieces would fetch nothing.
  // The defaults hold nothing.
  virtual bool ReadPiecesFromMemory(const DatasetPtr& dataset, uint32_t shard,
                                    std::span<const ChunkPiece> pieces, FetchPriority priority);
  virtual bool Holds(const DatasetPtr& dataset, uint32_t shard, uint64_t first, uint64_t count);
  virtual bool HoldsPieces(const DatasetPtr& dataset, uint32_t shard, std::span<const ChunkPiece> pieces);
  // Bytes of chunks the tiers at or below this source can keep at once (for a cache: its
  // largest tier's budget); 0 keeps nothing (the default).
  virtual uint64_t CapacityBytes() { return 0; }
  // True when ReadPieces fetches only the blocks covering the pieces from a remote (a gRPC
  // upstream, at or below this source), so a few samples cost about their own bytes on the link.
  virtual bool FetchesBlockRanges() { return false; }
  // True when many small block ranges queued together cost about one upstream call (a gRPC
  // upstream rides them on one stream), so fetching a global shuffle sample by sample in plan
  // order is cheap. A bucket answers each range with a request of its own: false there.
  virtual bool BatchesBlockRanges() { return false; }

  // A demand read waits for chunk `key`, which an earlier read (a prefetch) is fetching: that
  // fetch gets a demand read's urgency (its queue, its hedging when stuck). The default (nothing
  // fetched ahead) has nothing to do; tiers forward it to the source below.
  virtual void Expedite(const ChunkKey& key) {}

  // The daemon is stopping: reads waiting on a remote (a call in flight, a retry's backoff, a
  // queued fetch) end now with Cancelled or Aborted, and later ones fail at once, so that
  // whatever waits on them (batch assembly, warm jobs, Origin streams) ends within moments, not
  // at its deadline. Idempotent; the object stays valid until destroyed. Tiers forward it to the
  // source below; the default (local files) has nothing to cancel.
  virtual void Shutdown() {}

  // Convenience: one chunk.
  Result<ChunkPtr> ReadChunk(const DatasetPtr& dataset, uint32_t shard, uint64_t chunk,
                             const ReadOptions& options);
};

// Checks that [first, first+count) lies inside `shard` of `dataset`; InvalidArgument naming
// the range otherwise. Shared by every implementation.
Status CheckChunkRange(const DatasetPtr& dataset, uint32_t shard, uint64_t first, uint64_t count);

// Checks that `piece` lies inside a chunk of `chunk_length` bytes; InvalidArgument naming it
// otherwise.
Status CheckPiece(const DatasetPtr& dataset, uint32_t shard, const ChunkPiece& piece, uint64_t chunk_length);

// Every tier checks the names it is asked for with dataset::CheckDatasetName.
using dataset::CheckDatasetName;

// Summary line of a dataset for ListDatasets.
v1::DatasetSummary SummarizeDataset(const dataset::Dataset& d);

}  // namespace shardcache
