// Shard discovery: which files (or objects) of a dataset are its shards, by format. The one
// place the rules live, so `shardctl index DIR` and `shardctl index s3://…` pick the same shards
// from the same tree. Input is every file below the dataset root, by '/'-separated relative path
// (a directory walk, or a bucket listing with the dataset's prefix cut off); output is sorted by
// relative path (byte order):
//   - skipped: the dataset's own .shardcache/ and every subdirectory that is a dataset of its
//     own (holds a .shardcache/): "laion" and "laion/train" may both be indexed;
//   - records   every file;
//   - tar       every *.tar; a *.tar.gz or *.tgz is refused (InvalidArgument naming it: chunks
//               of a compressed stream cannot be served), so none is silently left out;
//   - megatron  every *.bin; each needs <same prefix>.idx beside it (its companion).
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "shardcache/manifest.pb.h"

namespace shardcache::dataset {

// One file below the dataset root.
struct ListedFile {
  std::string path;  // relative, '/'-separated, no leading '/'
  uint64_t size_bytes = 0;
};

// One shard the indexer will index.
struct ShardEntry {
  std::string path;            // relative, '/'-separated
  std::string companion_path;  // megatron .idx, relative; "" otherwise
  uint64_t size_bytes = 0;
};

// The shards among `files` (any order). `root` names the dataset root in messages ("DIR",
// "s3://bucket/prefix/name"); a file is named root + "/" + path. InvalidArgument for a path
// that is not valid UTF-8 or a gzipped tar shard, NotFound for a megatron .bin without its
// .idx or when no shard is found.
Result<std::vector<ShardEntry>> SelectShards(std::vector<ListedFile> files, v1::ShardFormat format,
                                             const std::string& root);

}  // namespace shardcache::dataset
