// The packer: turns a tree of many small files into WebDataset tar shards plus an index — the
// fix for "too many small files" I/O. Behind `shardctl pack SRC OUT`.
//
// Member names are "<key>.<ext>": ext is everything after the first '.' of the file's basename
// (none: empty), key is the rest of the relative path with '%' '/' and '.' escaped as %25 %2F
// %2E, so keys are flat, dot-free and map back to exactly one source path (DecodePackedName).
// Bytes that are not valid UTF-8 are escaped as %XX in both parts (keys are proto3 strings).
// Files are ordered by (key, ext), so the files of one sample ("x.jpg", "x.cls") are adjacent
// members and form one WebDataset sample; a sample is never split across shards. A new shard
// starts when the next sample would push the current one past shard_bytes (a single sample
// larger than that gets a shard of its own). Shards are OUT/shard-000000.tar ..., written on
// all cores, then indexed (IndexDirectory, format tar).
//
// Thread safety: PackDirectory may run concurrently on distinct output directories. `progress`
// is called only on the calling thread.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "common/status.h"
#include "dataset/manifest.h"

namespace shardcache::dataset {

struct PackOptions {
  // Target bytes per tar shard (headers included). Default: 256 MiB.
  uint64_t shard_bytes = 256ull << 20;
  // Passed to the indexer.
  uint64_t chunk_bytes = kDefaultChunkBytes;
  // Dataset name. Default: OUT's basename.
  std::string name;
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
