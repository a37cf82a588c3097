// The file system under the NVMe tier's directory: preparing cache.dir before the store opens
// (create it, or — with require_mount — insist that a disk is mounted there), fitting the byte
// budget to what the file system can hold, and the free space above the floor.
//
// cache.require_mount rule: cache.dir must exist and be a mount point itself (in
// /proc/self/mountinfo), other than "/". A subdirectory of a mounted disk does not count: a
// directory below a missing mount is exactly what an unmounted disk leaves behind, and it
// cannot be told apart from the mounted case. A missing cache.dir is refused, never created.
//
// Thread safety: plain functions; each does its own statvfs.
#pragma once

#include <cstdint>
#include <string>

#include "common/status.h"
#include "daemon/cache/cache_options.h"

namespace shardcache::cache {

// With options.require_mount: FailedPrecondition naming cache.dir and where it is (missing, on
// the root file system, or a directory of another mount) unless it is a mount point of its
// own. Without: creates the directory (mkdir -p).
Status PrepareCacheDir(const CacheOptions& options);

// `size_bytes`, or what the file system of options.dir can hold above the free-space floor
// when that is less (logging a warning naming both). Unchanged when the file system cannot be
// measured.
uint64_t FitToFileSystem(const CacheOptions& options, uint64_t size_bytes);

// Bytes the file system may still hand out before hitting the floor (negative below it);
// INT64_MAX when it cannot be measured.
int64_t HeadroomAboveFloor(const CacheOptions& options);

}  // namespace shardcache::cache
