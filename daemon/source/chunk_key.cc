#include "daemon/source/chunk_key.h"

#include <cstring>

#include <xxhash.h>

namespace shardcache {

Hash128 VersionId(std::string_view version) { return HashBytes(version); }

uint64_t Fingerprint(const ChunkKey& key) {
  uint8_t buf[28];
  std::memcpy(buf, &key.version.high, 8);
  std::memcpy(buf + 8, &key.version.low, 8);
  std::memcpy(buf + 16, &key.shard, 4);
  std::memcpy(buf + 20, &key.chunk, 8);
  return XXH3_64bits(buf, sizeof(buf));
}

std::string ChunkKey::ToString() const {
  return version.ToHex().substr(0, 12) + "/" + std::to_string(shard) + "/" + std::to_string(chunk);
}

}  // namespace shardcache
