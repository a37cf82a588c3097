#include "daemon/cache/disk_health.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <spdlog/spdlog.h>

#include "common/fs.h"
#include "daemon/cache/cache_metrics.h"

namespace shardcache::cache {
namespace {

using Clock = std::chrono::steady_clock;

// Creates, writes, syncs and removes one small file in `dir`: what the store does to a
// segment, in miniature.
Status WriteProbeFile(const std::string& dir) {
  const std::string path = dir + "/.health-probe";
  SC_ASSIGN_OR_RETURN(UniqueFd fd, OpenFile(path, O_WRONLY | O_CREAT | O_TRUNC, 0600));
  AlignedBuffer block(kDirectIoAlign);
  std::memset(block.data(), 0, block.size());
  Status s = PwriteFull(fd.get(), block.data(), block.size(), 0, path);
  if (s.ok() && ::fdatasync(fd.get()) != 0) s = ErrnoStatus(errno, "fdatasync " + path);
  if (::unlink(path.c_str()) != 0 && s.ok()) s = ErrnoStatus(errno, "unlink " + path);
  return s;
}

}  // namespace

Result<std::unique_ptr<DiskHealth>> DiskHealth::Open(const std::string& dir, std::chrono::seconds no_space_grace) {
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0) return ErrnoStatus(errno, "stat cache directory " + dir);
  CacheMetrics::Get().nvme_healthy->Set(1);
  return std::unique_ptr<DiskHealth>(new DiskHealth(dir, st.st_dev, st.st_ino, no_space_grace));
}

DiskHealth::DiskHealth(std::string dir, dev_t dev, ino_t ino, std::chrono::seconds no_space_grace)
    : dir_(std::move(dir)), dev_(dev), ino_(ino), no_space_grace_(no_space_grace) {}

DiskHealth::~DiskHealth() { CacheMetrics::Get().nvme_healthy->Set(1); }

void DiskHealth::ReportIoError(const Status& error) {
  CacheMetrics::Get().nvme_errors->Add();
  MutexLock lock(&mu_);
  io_error_ = error.ToString();
  UpdateLocked();
}

void DiskHealth::ReportNoSpace(const std::string& what) {
  MutexLock lock(&mu_);
  if (no_space_.empty()) no_space_since_ = Clock::now();
  no_space_ = what;
  UpdateLocked();
}

void DiskHealth::ReportSpace() {
  MutexLock lock(&mu_);
  if (no_space_.empty()) return;
  no_space_.clear();
  UpdateLocked();
}

void DiskHealth::Probe(bool room_for_segment) {
  std::string gone;
  struct stat st;
  if (::stat(dir_.c_str(), &st) != 0) {
    gone = "the cache directory is gone (" + std::string(std::strerror(errno)) + ")";
  } else if (st.st_dev != dev_ || st.st_ino != ino_) {
    gone = "the path no longer leads to the directory the cache opened (the disk was unmounted, or "
           "another file system is mounted over it)";
  }
  bool try_write = false;
  {
    MutexLock lock(&mu_);
    gone_ = gone;
    if (room_for_segment) no_space_.clear();
    try_write = gone.empty() && !io_error_.empty();
    UpdateLocked();
  }
  if (!try_write) return;
  const Status written = WriteProbeFile(dir_);
  if (!written.ok()) CacheMetrics::Get().nvme_errors->Add();
  MutexLock lock(&mu_);
  io_error_ = written.ok() ? std::string() : written.ToString();
  UpdateLocked();
}

std::string DiskHealth::problem() const {
  MutexLock lock(&mu_);
  return problem_;
}

void DiskHealth::UpdateLocked() {
  const auto now = Clock::now();
  std::string problem;
  if (!gone_.empty()) {
    problem = gone_;
  } else if (!io_error_.empty()) {
    problem = "I/O error: " + io_error_;
  } else if (!no_space_.empty() && now - no_space_since_ >= no_space_grace_) {
    problem = "the file system stays at its free-space floor (" + no_space_ +
              ") and the cache holds no segment to give back";
  }
  const bool was_healthy = problem_.empty();
  if (was_healthy && !problem.empty()) {
    failing_since_ = now;
    spdlog::error("cache disk {}: {}; serving from the other tiers and upstream without storing until it recovers",
                  dir_, problem);
  } else if (!was_healthy && problem.empty()) {
    spdlog::warn("cache disk {}: usable again after {:.0f} s; storing resumes", dir_,
                 std::chrono::duration<double>(now - failing_since_).count());
  }
  problem_ = problem;
  healthy_.store(problem.empty(), std::memory_order_release);
  CacheMetrics::Get().nvme_healthy->Set(problem.empty() ? 1 : 0);
}

}  // namespace shardcache::cache
