// SegmentFile: one preallocated file of the NVMe tier, seg-<id>.dat, holding chunk extents
// back to back. Layout:
//
//   0          a           b                                  segment_bytes
//   +----------+-----------+------------ ... ----+-------------+
//   | chunk A  |pad| chunk B |pad| ...             | unwritten   |
//   +----------+-----------+------------ ... ----+-------------+
//   every extent starts at a 4 KiB boundary and is padded to one (O_DIRECT)
//
// The file carries no header: where each chunk lies, its key and hash live in the RocksDB index
// (index_db.h), and only extents below the segment's durable watermark are ever trusted.
// Files are created with fallocate to their full size, so the cache's allocated bytes are
// exactly segments × segment_bytes, and written once, sequentially, with O_DIRECT (falling
// back to buffered I/O plus fdatasync on file systems that refuse O_DIRECT).
//
// Thread safety: Write is called by the single NVMe writer thread only; reads go through the
// fd (IoReader) from any thread. An unlinked segment stays readable through open shared_ptrs.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include <sys/uio.h>

#include "common/fs.h"
#include "common/status.h"

namespace shardcache::cache {

class SegmentFile {
 public:
  // "<dir>/seg-00000042.dat"
  static std::string PathFor(const std::string& dir, uint32_t id);
  // Parses a file name "seg-<8 digits>.dat"; false for anything else.
  static bool ParseName(const std::string& name, uint32_t* id);

  // Creates the file exclusively and preallocates `bytes`. ENOSPC → ResourceExhausted.
  static Result<std::shared_ptr<SegmentFile>> Create(const std::string& dir, uint32_t id, uint64_t bytes);
  // Opens an existing segment for reading (and nothing else); size_bytes() is its length.
  static Result<std::shared_ptr<SegmentFile>> OpenExisting(const std::string& dir, uint32_t id);

  // Writes `length` bytes (a 4 KiB multiple) from a 4 KiB-aligned buffer at `offset`.
  Status Write(const uint8_t* data, size_t length, uint64_t offset);
  // Writes `count` extents (each 4 KiB-aligned and a 4 KiB multiple) back to back from
  // `offset` with one pwritev where possible.
  Status WriteV(const struct iovec* iov, int count, uint64_t offset);
  Status Sync();
  // Removes the file name; readers holding this object keep reading the open fd.
  Status Unlink();

  uint32_t id() const { return id_; }
  int fd() const { return fd_.get(); }
  const std::string& path() const { return path_; }
  uint64_t size_bytes() const { return size_bytes_; }

 private:
  SegmentFile(uint32_t id, std::string path, UniqueFd fd, uint64_t size, bool direct)
      : id_(id), path_(std::move(path)), fd_(std::move(fd)), size_bytes_(size), direct_(direct) {}

  const uint32_t id_;
  const std::string path_;
  UniqueFd fd_;
  const uint64_t size_bytes_;
  const bool direct_;
};

}  // namespace shardcache::cache
