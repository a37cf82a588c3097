// The packer: turns a tree of many small files into WebDataset tar shards plus an index — the
// fix for "too many small files" I/O. Behind `shardctl pack SRC OUT`.
//
// Member names are the files' paths relative to SRC, so `tar -xf` of the shards gives back the
// tree; webdataset and this project's tar index (tar_format.h) both take a member's key to be
// its path up to the first '.' of its basename and its extension the rest, so "dir/x.jpg" and
// "dir/x.cls" form sample "dir/x" ('.' in directory names is fine). Escaped as %XX, and only in
// those names, is what would break that grouping or cannot be stored (PackedMemberName):
//   - '%' itself, so every member maps back to exactly one path (DecodePackedName);
//   - bytes that are not valid UTF-8 (keys are proto3 strings);
//   - a '.' that starts a basename (".hidden" would have an empty key: no sample);
//   - a basename's first '.' when it ends the name ("a." -> "a%2E."), which keeps it distinct
//     from "a";
// and a basename without an extension gets a '.' appended ("README" -> "README."), since a
// member without one belongs to no sample. Long paths get a pax header (tar_writer.h).
//
// Order: the files of one sample are adjacent members, by extension, and a sample is never
// split across shards. Samples are shuffled with a fixed seed by default (shuffle_seed), so
// that a block shuffle, which reads a window of shards at a time, mixes the tree's directories
// (classes) instead of reading one directory after another; without a seed they are in path
// order. A new shard starts when the next sample would push the current one past shard_bytes
// (a single sample larger than that gets a shard of its own). Shards are
// OUT/shard-000000.tar ..., written on all cores, then indexed (IndexDirectory, format tar).
//
// Thread safety: PackDirectory may run concurrently on distinct output directories. `progress`
// is called only on the calling thread.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "common/status.h"
#include "dataset/manifest.h"

namespace shardcache::dataset {

constexpr uint64_t kDefaultPackShuffleSeed = 0;

struct PackOptions {
  // Target bytes per tar shard (headers included). Default: 256 MiB.
  uint64_t shard_bytes = 256ull << 20;
  // Passed to the indexer.
  uint64_t chunk_bytes = kDefaultChunkBytes;
  // Dataset name: trailing components of OUT's path (see IndexOptions::name).
  std::string name;
  // Seed of the pack-time sample shuffle (a pure function of the seed and the file names);
  // nullopt = path order.
  std::optional<uint64_t> shuffle_seed = kDefaultPackShuffleSeed;
  // Worker threads for writing shards and hashing; 0 = all cores.
  unsigned threads = 0;
  // phase is "pack" (bytes of source files copied) or "index" (bytes hashed).
  std::function<void(const char* phase, uint64_t done_bytes, uint64_t total_bytes)> progress;
};

struct PackResult {
  DatasetPtr dataset;
  uint64_t files = 0;
  uint64_t file_bytes = 0;  // sum of source file sizes
};

// Packs src into out (created; must not exist or be empty, and must not lie inside src).
// Errors name the offending path: NotFound for an empty or missing src, FailedPrecondition for
// a non-empty out or a file that changes while being packed.
Result<PackResult> PackDirectory(const std::string& src, const std::string& out,
                                 const PackOptions& options);

// Member name for a file at relative path `rel` ('/'-separated).
std::string PackedMemberName(const std::string& rel);
// Inverse of PackedMemberName; InvalidArgument on a malformed escape.
Result<std::string> DecodePackedName(const std::string& member);

}  // namespace shardcache::dataset
