// TarWriter: writes a POSIX ustar archive that GNU tar, Python's tarfile and WebDataset read.
// Names longer than ustar's 100 (+155 prefix) bytes and sizes above ustar's 8 GiB - 1 get a pax
// extended header ('x') before the member. Output goes through a 1 MiB buffer; Finish() writes
// the two zero end blocks, fsyncs and closes. Used by `shardctl pack` and test datasets.
//
// Thread safety: one writer per thread; not internally synchronized.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "common/fs.h"
#include "common/status.h"

namespace shardcache::dataset {

class TarWriter {
 public:
  // Creates (truncates) `path`.
  static Result<std::unique_ptr<TarWriter>> Create(const std::string& path);
  ~TarWriter();

  // Adds a regular file member with the given bytes.
  Status AddBytes(const std::string& name, std::string_view data, int64_t mtime = 0,
                  uint32_t mode = 0644);
  // Adds a regular file member by copying `size_bytes` from the file at `source_path`.
  Status AddFile(const std::string& name, const std::string& source_path, uint64_t size_bytes,
                 int64_t mtime, uint32_t mode = 0644);
  // Writes the end-of-archive blocks, fsyncs and closes. REQUIRES: called once.
  Status Finish(bool fsync = true);

  // Bytes written so far (including buffered ones).
  uint64_t bytes() const { return offset_; }
  const std::string& path() const { return path_; }

  // Bytes a member of `name` and `size_bytes` takes in the archive (headers + padded data).
  static uint64_t MemberBytes(const std::string& name, uint64_t size_bytes);

 private:
  TarWriter(std::string path, UniqueFd fd) : path_(std::move(path)), fd_(std::move(fd)) {}
  Status WriteHeaders(const std::string& name, uint64_t size_bytes, int64_t mtime, uint32_t mode);
  Status Append(const void* data, size_t n);
  Status Pad();
  Status Flush();

  const std::string path_;
  UniqueFd fd_;
  std::string buf_;
  uint64_t offset_ = 0;       // logical bytes written, including buf_
  uint64_t flushed_ = 0;      // bytes already on disk
};

}  // namespace shardcache::dataset
