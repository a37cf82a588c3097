// Small RAII and file helpers shared by every component: an owned file descriptor, whole-file
// reads, crash-safe whole-file writes, and 4 KiB-aligned buffers for O_DIRECT I/O.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "common/status.h"

namespace shardcache {

class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  ~UniqueFd() { Reset(); }
  UniqueFd(UniqueFd&& o) noexcept : fd_(o.Release()) {}
  UniqueFd& operator=(UniqueFd&& o) noexcept {
    if (this != &o) { Reset(); fd_ = o.Release(); }
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int Release() { int f = fd_; fd_ = -1; return f; }
  void Reset(int fd = -1);

 private:
  int fd_ = -1;
};

// open(2) with O_CLOEXEC added; errors name the path.
Result<UniqueFd> OpenFile(const std::string& path, int flags, int mode = 0644);

// Reads a whole file. NotFound / PermissionDenied / Internal name the path.
Result<std::string> ReadFileToString(const std::string& path);

// pread exactly `size` bytes at `offset`; a short file is OutOfRange naming path and offset.
Status PreadFull(int fd, void* buf, size_t size, uint64_t offset, const std::string& path);
Status PwriteFull(int fd, const void* buf, size_t size, uint64_t offset, const std::string& path);

// Writes `data` to path.tmp, fsyncs it, renames it over `path` and fsyncs the directory, so a
// crash leaves either the old or the new file, never a torn one.
Status WriteFileAtomic(const std::string& path, const std::string& data);

// mkdir -p.
Status MakeDirs(const std::string& path);
// rm -rf (a path that does not exist is fine).
Status RemoveTree(const std::string& path);
// fsync of a directory: makes the names created or renamed in it durable.
Status FsyncDir(const std::string& dir);

// The mount point of the file system holding `path` (an existing path; symlinks resolved), from
// /proc/self/mountinfo: "/" for a directory on the root file system, `path` itself when a file
// system is mounted right there. NotFound naming the path when it does not exist.
Result<std::string> MountPointOf(const std::string& path);

constexpr size_t kDirectIoAlign = 4096;

inline uint64_t AlignUp(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }
inline uint64_t AlignDown(uint64_t v, uint64_t a) { return v / a * a; }

// Heap buffer aligned to kDirectIoAlign, for O_DIRECT reads and writes.
class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  // Capacity is rounded up to the alignment; size() starts equal to `size`.
  explicit AlignedBuffer(size_t size);
  AlignedBuffer(AlignedBuffer&&) noexcept = default;
  AlignedBuffer& operator=(AlignedBuffer&&) noexcept = default;

  uint8_t* data() { return data_.get(); }
  const uint8_t* data() const { return data_.get(); }
  size_t size() const { return size_; }
  size_t capacity() const { return capacity_; }
  // REQUIRES: n <= capacity().
  void Resize(size_t n) { size_ = n; }

 private:
  struct Free { void operator()(uint8_t* p) const { std::free(p); } };
  std::unique_ptr<uint8_t, Free> data_;
  size_t size_ = 0;
  size_t capacity_ = 0;
};

}  // namespace shardcache
