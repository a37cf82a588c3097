// ChunkKey: the identity of one chunk — (dataset version, shard, chunk index) — in every tier
// (the fetcher's single flights, the DRAM and NVMe tiers, the access plan, the loaders), and its
// 64-bit fingerprint, the key of the in-memory NVMe index and of the access plan.
//
// The version is carried as a 128-bit id (xxh3-128 of the version string), so a key is 28
// bytes on disk. The in-memory index keys on a 64-bit fingerprint of those 28 bytes to stay
// compact (chunk_index.h); a fingerprint collision can never serve wrong bytes, because
// every NVMe read is verified against the manifest hash of the chunk actually requested, and a
// mismatch is a dropped entry and a miss.
//
// Thread safety: values.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include "common/hash.h"

namespace shardcache {

struct ChunkKey {
  Hash128 version;   // VersionId(dataset version string)
  uint32_t shard = 0;
  uint64_t chunk = 0;

  bool operator==(const ChunkKey& o) const {
    return version == o.version && shard == o.shard && chunk == o.chunk;
  }
  // "version/shard/chunk" for log lines and error messages.
  std::string ToString() const;
};

// 128-bit id of a dataset version string.
Hash128 VersionId(std::string_view version);

inline ChunkKey MakeChunkKey(std::string_view version, uint32_t shard, uint64_t chunk) {
  return ChunkKey{VersionId(version), shard, chunk};
}

// Fingerprint used by the in-memory index, the DRAM tier's hash table and the access plan.
uint64_t Fingerprint(const ChunkKey& key);

struct ChunkKeyHash {
  size_t operator()(const ChunkKey& k) const { return static_cast<size_t>(Fingerprint(k)); }
};

}  // namespace shardcache
