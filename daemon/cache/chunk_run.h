// ChunkRun: a verified byte range of one chunk that the tiers keep on its own — the bytes of a
// sample whose chunk was not brought whole (a global shuffle of a dataset larger than the cache
// reads pieces only; a cold epoch's first batches read their blocks first). A run is kept as if
// it were a chunk under a key of its own (RunKey), so the DRAM tier, the NVMe write queue,
// segments, the RocksDB index, recovery after a crash and eviction treat it like any chunk:
// a partial chunk is the set of its runs the tiers hold.
//
// A run's stored bytes are the range followed by a 16-byte trailer: xxh3-128 over the run's
// identity (dataset version, shard, chunk, offset, length) and the range. The manifest has no
// hash for an arbitrary range, so a run is checked against its trailer whenever it is read back
// from NVMe: a torn, flipped or misplaced run, or another run whose key fingerprint collides,
// fails and is a miss, never wrong bytes. The trailer is computed from bytes the upstream
// verified against the manifest (its block table, checked against the chunk's Merkle root).
//
// Thread safety: values and pure functions.
#pragma once

#include <cstdint>

#include "common/hash.h"
#include "daemon/source/chunk_key.h"
#include "daemon/source/chunk_source.h"

namespace shardcache::cache {

// Bytes [offset, offset + length) of chunk `chunk`.
struct RunId {
  ChunkKey chunk;
  uint64_t offset = 0;
  uint64_t length = 0;
};

constexpr uint64_t kRunTrailerBytes = 16;
// ChunkKey::chunk of every run key has this bit set; chunk indexes never do.
constexpr uint64_t kRunKeyTag = 1ull << 63;

// The key a run is kept under: the chunk's version and shard, and a tagged 63-bit digest of
// (chunk, offset, length) as the chunk index.
ChunkKey RunKey(const RunId& id);
// True for keys made by RunKey.
inline bool IsRunKey(const ChunkKey& key) { return (key.chunk & kRunKeyTag) != 0; }
// Bytes a run occupies as a chunk: the range and its trailer.
inline uint64_t RunStoredBytes(const RunId& id) { return id.length + kRunTrailerBytes; }

// A run to fill in place: RunStoredBytes(id) bytes, the range first. Once the range holds
// id.length verified bytes, SealRun writes their trailer and the run's hash: a chunk to keep.
std::shared_ptr<Chunk> NewRun(const RunId& id);
void SealRun(const RunId& id, Chunk& run);
// True when `stored` (RunStoredBytes(id) bytes) is this run with an intact trailer.
bool RunIntact(const RunId& id, const uint8_t* stored, uint64_t stored_length);

}  // namespace shardcache::cache
