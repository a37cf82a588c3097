#include "daemon/cache/cache_dir.h"

#include <sys/stat.h>
#include <sys/statvfs.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <filesystem>

#include <spdlog/spdlog.h>

#include "common/fs.h"
#include "common/units.h"

namespace shardcache::cache {
namespace {

struct Space {
  uint64_t total = 0;      // size of the file system
  uint64_t available = 0;  // what an unprivileged writer may still allocate
};

bool Measure(const std::string& dir, Space* out) {
  struct statvfs vfs;
  if (statvfs(dir.c_str(), &vfs) != 0) return false;
  out->total = static_cast<uint64_t>(vfs.f_blocks) * vfs.f_frsize;
  out->available = static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize;
  return true;
}

}  // namespace

Status PrepareCacheDir(const CacheOptions& options) {
  const std::string& dir = options.dir;
  if (!options.require_mount) return MakeDirs(dir);
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0) {
    if (errno != ENOENT) return ErrnoStatus(errno, "cache.dir " + dir);
    return FailedPrecondition("cache.dir " + dir + " does not exist; with cache.require_mount = true it is not "
                              "created (it would be a directory on whatever file system lies below): mount the "
                              "cache disk at " + dir);
  }
  SC_ASSIGN_OR_RETURN(std::string mount_point, MountPointOf(dir));
  std::error_code ec;
  const std::string real = std::filesystem::canonical(dir, ec).string();
  if (mount_point == "/") {
    return FailedPrecondition("cache.dir " + dir + " is on the root file system, not on a disk of its own "
                              "(cache.require_mount = true): mount the cache disk at " + dir +
                              ", or set cache.require_mount = false");
  }
  if (mount_point != real) {
    return FailedPrecondition("cache.dir " + dir + " is not a mount point but a directory of the file system "
                              "mounted at " + mount_point + " (cache.require_mount = true wants the cache disk "
                              "mounted at cache.dir itself)");
  }
  return Status::Ok();
}

uint64_t FitToFileSystem(const CacheOptions& options, uint64_t size_bytes) {
  Space space;
  if (!Measure(options.dir, &space)) return size_bytes;
  const uint64_t floor = options.min_free.BytesFor(space.total);
  const uint64_t holds = space.total > floor ? space.total - floor : 0;
  if (size_bytes <= holds) return size_bytes;
  spdlog::warn("cache.size {} is more than the file system of {} can hold ({}: {} minus the {} min_free floor); "
               "the NVMe budget is {}",
               FormatBytes(size_bytes), options.dir, FormatBytes(holds), FormatBytes(space.total),
               FormatBytes(floor), FormatBytes(holds));
  return holds;
}

int64_t HeadroomAboveFloor(const CacheOptions& options) {
  Space space;
  if (!Measure(options.dir, &space)) return INT64_MAX;
  return static_cast<int64_t>(space.available) - static_cast<int64_t>(options.min_free.BytesFor(space.total));
}

}  // namespace shardcache::cache
