#include "dataset/object_byte_source.h"

#include <algorithm>
#include <cstring>

namespace shardcache::dataset {

ObjectByteSource::ObjectByteSource(objstore::ObjectClient& client, std::string key, uint64_t size, std::string etag,
                                   uint64_t block_bytes)
    : client_(client),
      key_(std::move(key)),
      name_(client.uri().Describe(key_)),
      size_bytes_(size),
      etag_(std::move(etag)),
      block_bytes_(std::max<uint64_t>(block_bytes, 1)) {}

Result<std::shared_ptr<const std::string>> ObjectByteSource::GetBlock(uint64_t index) const {
  {
    MutexLock lock(&mu_);
    for (size_t i = 0; i < cached_.size(); ++i) {
      if (cached_[i].index != index) continue;
      Block hit = cached_[i];
      cached_.erase(cached_.begin() + static_cast<std::ptrdiff_t>(i));
      cached_.push_back(hit);
      return hit.bytes;
    }
  }
  // Fetched without the lock: two threads may fetch the same block; both get the same bytes.
  const uint64_t offset = index * block_bytes_;
  const uint64_t length = std::min(block_bytes_, size_bytes_ - offset);
  SC_ASSIGN_OR_RETURN(std::string bytes, client_.ReadRange(key_, offset, length, etag_, size_bytes_));
  auto block = std::make_shared<const std::string>(std::move(bytes));
  MutexLock lock(&mu_);
  if (cached_.size() >= kCachedBlocks) cached_.erase(cached_.begin());
  cached_.push_back(Block{index, block});
  return block;
}

Status ObjectByteSource::ReadAt(uint64_t offset, void* buf, size_t n) const {
  SC_RETURN_IF_ERROR(CheckRange(offset, n));
  if (n == 0) return Status::Ok();
  if (n >= block_bytes_) {
    objstore::RangeRead r{key_, offset, n, etag_, size_bytes_, static_cast<uint8_t*>(buf)};
    auto got = client_.ReadRanges({r});
    return got.front().status();
  }
  auto* out = static_cast<char*>(buf);
  uint64_t at = offset;
  const uint64_t end = offset + n;
  while (at < end) {
    const uint64_t index = at / block_bytes_;
    SC_ASSIGN_OR_RETURN(std::shared_ptr<const std::string> block, GetBlock(index));
    const uint64_t in_block = at - index * block_bytes_;
    const uint64_t take = std::min<uint64_t>(end - at, block->size() - in_block);
    std::memcpy(out + (at - offset), block->data() + in_block, take);
    at += take;
  }
  return Status::Ok();
}

}  // namespace shardcache::dataset
