// ObjectSource: a ChunkSource over object storage (upstream = "s3://BUCKET/PREFIX" or
// "https://HOST/PATH"), read with objstore::ObjectClient — the object-storage twin of FileSource.
//
// Layout: the same as a directory's, with keys for paths. Dataset NAME lives under the URI's
// prefix: its manifest is PREFIX/NAME/.shardcache/manifest.pb, its sample indexes
// PREFIX/NAME/.shardcache/samples/<shard>.pb, its block tables (optional: ReadPieces)
// PREFIX/NAME/.shardcache/blocks/<shard>.bin, and its shards PREFIX/NAME/<shard path> as the
// manifest records them (`shardctl index` output uploaded as is). ListDatasets finds every
// manifest key under the prefix (s3:// only: plain https has no listing, so it is Unimplemented
// there and datasets are opened by name).
//
// OpenDataset HEADs the manifest and reloads it when its ETag changed (a re-indexed dataset is
// published without a restart), then checks every shard object's size against the manifest
// (DataLoss naming the object otherwise) and remembers the shards' ETags. ReadChunks reads
// chunks with concurrent ranged GETs (a sliding window of kReadWindowChunks in flight, each
// chunk as parts of kReadPartBytes on their own connections) that carry those
// ETags and sizes, so an object rewritten since is a named FailedPrecondition, never a mix; every
// chunk is then verified against its manifest hash exactly as FileSource does (DataLoss naming
// dataset, object, chunk and offset; counted in shardcache_objstore_checksum_failures_total).
// Retries, resumption and the named transport errors are ObjectClient's (objstore/).
//
// Thread safety: safe for concurrent use (the manifest cache takes a mutex; reads run on the
// client's driver thread).
#pragma once

#include <map>
#include <memory>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "common/mutex.h"
#include "daemon/source/chunk_source.h"
#include "daemon/upstream/block_tables.h"
#include "objstore/object_client.h"

namespace shardcache::upstream {

class ObjectSource final : public ChunkSource {
 public:
  // Chunks in flight per ReadChunks call: enough to keep a 64-connection pool busy with a
  // few readers, little enough that a window (4 MiB chunks: 64 MiB) is held only briefly.
  static constexpr uint64_t kReadWindowChunks = 16;
  // Each chunk is read as ranged GETs of at most this many bytes, concurrently.
  static constexpr uint64_t kReadPartBytes = 1 << 20;

  // InvalidArgument for a URI ParseObjectUri refuses or bad options; what ObjectClient::Open
  // returns otherwise. Nothing is requested until the first call.
  static Result<std::unique_ptr<ObjectSource>> Open(const std::string& uri,
                                                    const objstore::ObjectStoreOptions& options);

  Result<std::vector<v1::DatasetSummary>> ListDatasets() override;
  Result<DatasetPtr> OpenDataset(const std::string& name) override;
  Result<std::string> GetSampleIndex(const DatasetPtr& dataset, uint32_t shard) override;
  Status ReadChunks(const DatasetPtr& dataset, uint32_t shard, uint64_t first, uint64_t count,
                    const ReadOptions& options, const ChunkSink& sink) override;
  // Only the 16 KiB blocks covering each piece, as ranged GETs, each block checked against its
  // chunk's block table (the index's .shardcache/blocks/SHARD.bin object, itself checked against
  // the manifest's chunk hash). The pieces of a chunk without a usable table (an index from
  // before the tables) are read through whole chunks, as the default does.
  Status ReadPieces(const DatasetPtr& dataset, uint32_t shard, std::span<const ChunkPiece> pieces,
                    const ReadOptions& options) override;
  bool FetchesBlockRanges() override { return true; }
  // Requests in flight end with Cancelled, later ones fail at once (ObjectClient::Shutdown).
  void Shutdown() override { client_->Shutdown(); }

  objstore::ObjectClient& client() { return *client_; }

 private:
  // A loaded dataset with what its objects looked like when it was loaded.
  struct Loaded {
    DatasetPtr dataset;
    std::string manifest_etag;
    std::vector<objstore::ObjectStat> shards;  // by shard index
  };
  using LoadedPtr = std::shared_ptr<const Loaded>;

  explicit ObjectSource(std::unique_ptr<objstore::ObjectClient> client) : client_(std::move(client)) {}

  // Key of `relative` below dataset `name`.
  std::string DatasetKey(const std::string& name, const std::string& relative) const;
  // Size and ETag of every shard object of `d`, checked against the manifest.
  Result<std::vector<objstore::ObjectStat>> StatShards(const dataset::Dataset& d);
  // The shard objects' state for `d` when it is the version loaded last (else: unknown ETags,
  // the manifest's sizes).
  objstore::ObjectStat ShardState(const DatasetPtr& d, uint32_t shard);
  // True once the shard's block tables object was found missing (not asked for again).
  bool TablesMissing(const DatasetPtr& d, uint32_t shard);
  // The block table of `chunk` as read (`got`), checked against the manifest and kept in
  // tables_; null (logged, and a missing object remembered) when it is unusable.
  BlockTablePtr AdoptTable(const DatasetPtr& d, uint32_t shard, uint64_t chunk, Result<std::string> got);
  // Verifies chunk `c` read from `object` (its bytes in place) and hands it to `sink`.
  Status Deliver(const DatasetPtr& d, uint32_t shard, uint64_t c, const std::string& object,
                 std::shared_ptr<Chunk> chunk, const ChunkSink& sink);

  std::unique_ptr<objstore::ObjectClient> client_;
  Mutex mu_;
  std::map<std::string, LoadedPtr> loaded_ GUARDED_BY(mu_);  // by dataset name
  BlockTables tables_;  // verified block tables of chunks read in pieces
  // "VERSION/SHARD" of shards whose block tables object is missing: not asked for again.
  std::set<std::string> no_tables_ GUARDED_BY(mu_);
};

}  // namespace shardcache::upstream
