// FileSource: the origin role — a ChunkSource over a directory (upstream = "file:///root").
//
// Layout: every directory below `root` holding .shardcache/manifest.pb (written by
// `shardctl index` / `shardctl pack`) is a dataset named after its path below the root
// ("laion/train" is ROOT/laion/train; see dataset/dataset_name.h), whatever name its manifest
// was indexed with. ListDatasets walks the root's real (not symlinked) directories down to
// kMaxDatasetNameComponents levels and stops at each dataset: a dataset's subdirectories hold its
// shards, not further datasets (those can still be opened by name).
//
// Nothing outside `root` is ever opened: dataset names must pass CheckDatasetName, and every
// path (dataset directory, manifest, sample index, shard) is opened with openat2(2)
// RESOLVE_BENEATH relative to the root's directory fd. What that refuses lexically (an
// absolute symlink) is opened plainly and kept only if the opened descriptor's real path
// (/proc/self/fd) lies inside the root. A symlink or ".." leading out of the root — at any
// component — is PermissionDenied; symlinks that stay inside the root are followed.

// Manifests are cached per dataset and reloaded when the manifest file's identity (inode,
// size, mtime) changes, so re-indexing a dataset publishes the new version without a restart.
// Shard file sizes are checked against the manifest at load and again on every read.
//
// Every chunk read is verified against its manifest hash before it is handed out; a mismatch is
// DataLoss naming dataset, shard file, chunk and offset, and is counted in
// shardcache_origin_checksum_failures_total. Corrupt data is never served.
//
// Block ranges (ReadBlocks): the first range of a chunk reads and verifies the whole chunk and
// remembers its block table (BlockTables); later ranges of it read only their blocks and check
// each against the table, so a global shuffle of small samples costs the origin's disk about the
// bytes it serves, not a whole chunk per sample.
//
// Thread safety: safe for concurrent use (the manifest cache takes a mutex; reads are pread).
#pragma once

#include <sys/types.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/fs.h"
#include "common/mutex.h"
#include "daemon/source/chunk_source.h"
#include "daemon/upstream/block_tables.h"

namespace shardcache::upstream {

class FileSource final : public ChunkSource {
 public:
  // `root` must be an existing directory (NotFound / FailedPrecondition otherwise).
  static Result<std::unique_ptr<FileSource>> Open(const std::string& root);

  Result<std::vector<v1::DatasetSummary>> ListDatasets() override;
  Result<DatasetPtr> OpenDataset(const std::string& name) override;
  Result<std::string> GetSampleIndex(const DatasetPtr& dataset, uint32_t shard) override;
  Status ReadChunks(const DatasetPtr& dataset, uint32_t shard, uint64_t first, uint64_t count,
                    const ReadOptions& options, const ChunkSink& sink) override;
  Result<BlockRange> ReadBlocks(const DatasetPtr& dataset, uint32_t shard, uint64_t chunk, uint32_t first_block,
                                uint32_t block_count, bool want_table, const ReadOptions& options) override;

  const std::string& root() const { return root_; }

 private:
  FileSource(std::string root, UniqueFd root_fd) : root_(std::move(root)), root_fd_(std::move(root_fd)) {}

  // Opens `relative` (below the root) refusing any resolution that leaves the root.
  Result<UniqueFd> OpenBeneath(const std::string& relative, int flags) const;
  // Appends the datasets at and below directory `dir` (relative to the root, "" = the root,
  // `depth` components).
  Status ListBelow(const std::string& dir, size_t depth, std::vector<v1::DatasetSummary>* out);
  // Opens a shard file of `dataset` and checks its size against the manifest.
  Result<UniqueFd> OpenShard(const dataset::Dataset& dataset, uint32_t shard) const;
  // The block table of a chunk as `shardctl index` stored it (dataset::BlockTablesPath), checked
  // against the manifest's chunk hash; an error when it is absent (an index from before the
  // tables, an object store) or disagrees (then the caller hashes the chunk itself).
  Result<BlockTablePtr> StoredTable(const dataset::Dataset& dataset, uint32_t shard, uint64_t chunk) const;

  struct Cached {
    DatasetPtr dataset;
    dev_t dev = 0;
    ino_t ino = 0;
    off_t size = 0;
    int64_t mtime_ns = 0;
  };

  const std::string root_;   // as given, for messages
  const UniqueFd root_fd_;   // O_RDONLY | O_DIRECTORY; every open is relative to it
  BlockTables tables_;       // of chunks read whole or stored by the indexer, for ReadBlocks
  Mutex mu_;
  std::map<std::string, Cached> cache_ GUARDED_BY(mu_);  // by dataset name
};

}  // namespace shardcache::upstream
