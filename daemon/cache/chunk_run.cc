#include "daemon/cache/chunk_run.h"

#include <cstring>

#include <xxhash.h>

namespace shardcache::cache {
namespace {

// Identity bytes: version (16), shard (4), chunk (8), offset (8), length (8).
constexpr size_t kIdentityBytes = 44;

void Identity(const RunId& id, uint8_t* out) {
  std::memcpy(out, &id.chunk.version.high, 8);
  std::memcpy(out + 8, &id.chunk.version.low, 8);
  std::memcpy(out + 16, &id.chunk.shard, 4);
  std::memcpy(out + 20, &id.chunk.chunk, 8);
  std::memcpy(out + 28, &id.offset, 8);
  std::memcpy(out + 36, &id.length, 8);
}

Hash128 Trailer(const RunId& id, const uint8_t* bytes) {
  uint8_t identity[kIdentityBytes];
  Identity(id, identity);
  StreamingHasher hasher;
  hasher.Update(identity, sizeof(identity));
  hasher.Update(bytes, id.length);
  return hasher.Digest();
}

}  // namespace

ChunkKey RunKey(const RunId& id) {
  uint8_t identity[kIdentityBytes];
  Identity(id, identity);
  // The version and shard stay readable (EvictVersion drops a version's runs with its chunks).
  return ChunkKey{id.chunk.version, id.chunk.shard, kRunKeyTag | (XXH3_64bits(identity, sizeof(identity)) >> 1)};
}

std::shared_ptr<Chunk> NewRun(const RunId& id) {
  auto run = std::make_shared<Chunk>();
  run->bytes = AlignedBuffer(RunStoredBytes(id));
  return run;
}

void SealRun(const RunId& id, Chunk& run) {
  run.hash = Trailer(id, run.bytes.data());  // the run's own hash (the tiers' records keep it)
  const std::string trailer = run.hash.ToBytes();
  std::memcpy(run.bytes.data() + id.length, trailer.data(), kRunTrailerBytes);
}

bool RunIntact(const RunId& id, const uint8_t* stored, uint64_t stored_length) {
  if (stored_length != RunStoredBytes(id)) return false;
  const std::string want = Trailer(id, stored).ToBytes();
  return std::memcmp(stored + id.length, want.data(), kRunTrailerBytes) == 0;
}

}  // namespace shardcache::cache
