// ByteSource: random-access, read-only bytes of one shard, named for error messages. Shard
// parsers (tar, megatron) read through it so the same code runs on files (indexing) and on
// memory (fuzz targets, tests) with identical bounds checks.
//
// Thread safety: ReadAt is const and safe to call from many threads at once (pread / memcpy).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "common/fs.h"
#include "common/status.h"

namespace shardcache::dataset {

class ByteSource {
 public:
  virtual ~ByteSource() = default;
  // Total size in bytes, fixed at construction.
  virtual uint64_t size() const = 0;
  // Name used in error messages (a path, or "<memory>").
  virtual const std::string& name() const = 0;
  // Reads exactly n bytes at offset. OutOfRange (naming name() and offset) when
  // [offset, offset + n) is not inside [0, size()).
  virtual Status ReadAt(uint64_t offset, void* buf, size_t n) const = 0;

 protected:
  Status CheckRange(uint64_t offset, size_t n) const;
};

// A file opened read-only; size() is the size at open time.
class FileByteSource final : public ByteSource {
 public:
  static Result<std::unique_ptr<FileByteSource>> Open(const std::string& path);
  uint64_t size() const override { return size_bytes_; }
  const std::string& name() const override { return path_; }
  Status ReadAt(uint64_t offset, void* buf, size_t n) const override;
  int fd() const { return fd_.get(); }

 private:
  FileByteSource(std::string path, UniqueFd fd, uint64_t size_bytes)
      : path_(std::move(path)), fd_(std::move(fd)), size_bytes_(size_bytes) {}
  const std::string path_;
  const UniqueFd fd_;
  const uint64_t size_bytes_;
};

// Bytes owned elsewhere; the caller keeps them alive for the source's lifetime.
class MemoryByteSource final : public ByteSource {
 public:
  explicit MemoryByteSource(std::string_view bytes, std::string name = "<memory>")
      : bytes_(bytes), name_(std::move(name)) {}
  uint64_t size() const override { return bytes_.size(); }
  const std::string& name() const override { return name_; }
  Status ReadAt(uint64_t offset, void* buf, size_t n) const override;

 private:
  const std::string_view bytes_;
  const std::string name_;
};

}  // namespace shardcache::dataset
