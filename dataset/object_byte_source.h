// ObjectByteSource: a ByteSource over one object in a bucket, read with ranged GETs through an
// objstore::ObjectClient — how shard parsers (tar) and the chunk hasher read a dataset in place
// in object storage (`shardctl index s3://…`, object_indexer.h).
//
// Every read carries the object's size and ETag as listed, so an object rewritten while it is
// being indexed is a named FailedPrecondition (objstore/errors.h), never a mix of old and new
// bytes. Reads of at least block_bytes go straight to the caller's buffer in one ranged GET
// (chunk hashing); smaller ones (a tar parser's 512-byte headers) are served from whole aligned
// blocks, a few of which are kept, so walking the headers of a shard of small samples costs a
// request per block instead of one per header.
//
// Thread safety: ReadAt may be called from many threads at once (the block cache takes a
// mutex, never held across a request). `client` must outlive the source.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/mutex.h"
#include "dataset/byte_source.h"
#include "objstore/object_client.h"

namespace shardcache::dataset {

class ObjectByteSource final : public ByteSource {
 public:
  // 1 MiB: a tar header walk over small samples reads each block once, and a header of a shard
  // of large members (video) costs one MiB instead of the member.
  static constexpr uint64_t kDefaultBlockBytes = 1 << 20;
  static constexpr size_t kCachedBlocks = 4;

  // `key` is the full key below the bucket; `size` and `etag` as listed ("" = not checked).
  ObjectByteSource(objstore::ObjectClient& client, std::string key, uint64_t size, std::string etag,
                   uint64_t block_bytes = kDefaultBlockBytes);

  uint64_t size() const override { return size_bytes_; }
  // "s3://bucket/key".
  const std::string& name() const override { return name_; }
  // OutOfRange past the end; otherwise what the ranged GET returns (objstore/errors.h).
  Status ReadAt(uint64_t offset, void* buf, size_t n) const override;

 private:
  struct Block {
    uint64_t index = 0;
    std::shared_ptr<const std::string> bytes;
  };
  // Block `index` (from the cache, or fetched and cached).
  Result<std::shared_ptr<const std::string>> GetBlock(uint64_t index) const;

  objstore::ObjectClient& client_;
  const std::string key_;
  const std::string name_;
  const uint64_t size_bytes_;
  const std::string etag_;
  const uint64_t block_bytes_;
  mutable Mutex mu_;
  mutable std::vector<Block> cached_ GUARDED_BY(mu_);  // most recently used last
};

}  // namespace shardcache::dataset
