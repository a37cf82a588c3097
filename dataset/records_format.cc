#include "dataset/records_format.h"

#include <cstdint>

#include "dataset/manifest.h"

namespace shardcache::dataset {

Result<v1::SampleIndex> IndexRecordsShard(const std::string& path, uint64_t size_bytes,
                                          uint64_t record_bytes) {
  if (record_bytes == 0) {
    return InvalidArgument(path + ": records format needs a record size (--record-bytes)");
  }
  if (size_bytes % record_bytes != 0) {
    return InvalidArgument(path + ": size " + std::to_string(size_bytes) +
                           " bytes is not a multiple of the record size " +
                           std::to_string(record_bytes) + " (" +
                           std::to_string(size_bytes % record_bytes) +
                           " trailing bytes after the last whole record at offset " +
                           std::to_string(size_bytes - size_bytes % record_bytes) + ")");
  }
  const uint64_t count = size_bytes / record_bytes;
  if (count > static_cast<uint64_t>(INT32_MAX)) {
    return InvalidArgument(path + ": " + std::to_string(count) +
                           " records is more than one shard's sample index can hold (2^31-1)");
  }
  v1::SampleIndex idx;
  idx.set_format_version(kSampleIndexFormatVersion);
  idx.mutable_offsets()->Reserve(static_cast<int>(count));
  idx.mutable_lengths()->Reserve(static_cast<int>(count));
  for (uint64_t i = 0; i < count; ++i) {
    idx.add_offsets(i * record_bytes);
    idx.add_lengths(record_bytes);
  }
  return idx;
}

}  // namespace shardcache::dataset
