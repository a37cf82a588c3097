#include "daemon/cache/segment_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include <spdlog/spdlog.h>

namespace shardcache::cache {
namespace {

Result<std::pair<UniqueFd, bool>> OpenMaybeDirect(const std::string& path, int flags) {
  int fd = ::open(path.c_str(), flags | O_DIRECT | O_CLOEXEC, 0644);
  if (fd >= 0) return std::make_pair(UniqueFd(fd), true);
  if (errno != EINVAL) return ErrnoStatus(errno, "open " + path);
  static std::atomic<bool> logged{false};
  if (!logged.exchange(true)) {
    spdlog::warn("{}: file system refuses O_DIRECT; cache segments use buffered I/O + fdatasync", path);
  }
  fd = ::open(path.c_str(), flags | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoStatus(errno, "open " + path);
  return std::make_pair(UniqueFd(fd), false);
}

}  // namespace

std::string SegmentFile::PathFor(const std::string& dir, uint32_t id) {
  char name[32];
  std::snprintf(name, sizeof(name), "seg-%08u.dat", id);
  return dir + "/" + name;
}

bool SegmentFile::ParseName(const std::string& name, uint32_t* id) {
  if (name.size() != 16 || name.compare(0, 4, "seg-") != 0 || name.compare(12, 4, ".dat") != 0) {
    return false;
  }
  uint64_t v = 0;
  for (size_t i = 4; i < 12; ++i) {
    if (name[i] < '0' || name[i] > '9') return false;
    v = v * 10 + static_cast<uint64_t>(name[i] - '0');
  }
  if (v > UINT32_MAX) return false;
  *id = static_cast<uint32_t>(v);
  return true;
}

Result<std::shared_ptr<SegmentFile>> SegmentFile::Create(const std::string& dir, uint32_t id, uint64_t bytes) {
  const std::string path = PathFor(dir, id);
  SC_ASSIGN_OR_RETURN(auto opened, OpenMaybeDirect(path, O_RDWR | O_CREAT | O_EXCL));
  int rc = ::posix_fallocate(opened.first.get(), 0, static_cast<off_t>(bytes));
  if (rc != 0) {
    ::unlink(path.c_str());
    return ErrnoStatus(rc, "preallocating " + std::to_string(bytes) + " bytes for " + path);
  }
  // The name must be durable before any index entry that points into the file is committed.
  SC_RETURN_IF_ERROR(FsyncDir(dir));
  return std::shared_ptr<SegmentFile>(new SegmentFile(id, path, std::move(opened.first), bytes, opened.second));
}

Result<std::shared_ptr<SegmentFile>> SegmentFile::OpenExisting(const std::string& dir, uint32_t id) {
  const std::string path = PathFor(dir, id);
  SC_ASSIGN_OR_RETURN(auto opened, OpenMaybeDirect(path, O_RDONLY));
  struct stat st;
  if (fstat(opened.first.get(), &st) != 0) return ErrnoStatus(errno, "stat " + path);
  return std::shared_ptr<SegmentFile>(
      new SegmentFile(id, path, std::move(opened.first), static_cast<uint64_t>(st.st_size), opened.second));
}

Status SegmentFile::Write(const uint8_t* data, size_t length, uint64_t offset) {
  if (offset + length > size_bytes_) {
    return Internal(path_ + ": write of " + std::to_string(length) + " bytes at offset " +
                    std::to_string(offset) + " runs past the segment end " + std::to_string(size_bytes_));
  }
  return PwriteFull(fd_.get(), data, length, offset, path_);
}

Status SegmentFile::WriteV(const struct iovec* iov, int count, uint64_t offset) {
  uint64_t total = 0;
  for (int i = 0; i < count; ++i) total += iov[i].iov_len;
  if (offset + total > size_bytes_) {
    return Internal(path_ + ": write of " + std::to_string(total) + " bytes at offset " +
                    std::to_string(offset) + " runs past the segment end " + std::to_string(size_bytes_));
  }
  ssize_t n;
  do {
    n = ::pwritev(fd_.get(), iov, count, static_cast<off_t>(offset));
  } while (n < 0 && errno == EINTR);
  if (n < 0) return ErrnoStatus(errno, "write " + path_ + " at offset " + std::to_string(offset));
  if (static_cast<uint64_t>(n) == total) return Status::Ok();
  // Short vector write: redo extent by extent (rewriting is harmless: nothing points here yet).
  uint64_t at = offset;
  for (int i = 0; i < count; ++i) {
    SC_RETURN_IF_ERROR(PwriteFull(fd_.get(), iov[i].iov_base, iov[i].iov_len, at, path_));
    at += iov[i].iov_len;
  }
  return Status::Ok();
}

Status SegmentFile::Sync() {
  if (::fdatasync(fd_.get()) != 0) return ErrnoStatus(errno, "fdatasync " + path_);
  return Status::Ok();
}

Status SegmentFile::Unlink() {
  if (::unlink(path_.c_str()) != 0 && errno != ENOENT) return ErrnoStatus(errno, "unlink " + path_);
  return Status::Ok();
}

}  // namespace shardcache::cache
