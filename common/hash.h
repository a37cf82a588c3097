// Hashes: xxh3-128 values stored as 16 bytes (high 64 bits first, big-endian) in manifests and
// on the wire, and printed as 32 lowercase hex digits.
//
// A chunk's hash (manifest format 2) is a Merkle root: xxh3-128 over the chunk's *block table*,
// the concatenated 16-byte xxh3-128 hashes of its kChunkBlockBytes blocks (the last may be
// short). A byte range of whole blocks can then be verified without the rest of the chunk: check
// the table against the manifest's root once, then each block against its table entry.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace shardcache {

struct Hash128 {
  uint64_t high = 0;
  uint64_t low = 0;
  bool operator==(const Hash128& o) const { return high == o.high && low == o.low; }
  bool operator!=(const Hash128& o) const { return !(*this == o); }

  std::string ToBytes() const;     // 16 bytes
  std::string ToHex() const;       // 32 hex digits
  // REQUIRES: bytes.size() >= 16. Reads the first 16 bytes.
  static Hash128 FromBytes(std::string_view bytes);
};

Hash128 HashBytes(const void* data, size_t size);
inline Hash128 HashBytes(std::string_view s) { return HashBytes(s.data(), s.size()); }

// Blocks of a chunk's Merkle hash: the unit of verified sub-chunk fetches. 16 KiB keeps a range
// for one small sample close to the sample's size (64 KiB blocks fetched 4x a 16 KiB sample)
// while a 4 MiB chunk's table stays 4 KiB (0.1% of the chunk).
constexpr size_t kChunkBlockBytes = 16 << 10;
constexpr size_t kBlockHashBytes = 16;

// Blocks of a chunk of `size` bytes (a chunk of 0 bytes has none).
inline size_t ChunkBlockCount(size_t size) { return (size + kChunkBlockBytes - 1) / kChunkBlockBytes; }
// The block table of `size` bytes at `data`: kBlockHashBytes per block.
std::string BlockTable(const void* data, size_t size);
// The Merkle root of a block table (what the manifest stores as the chunk's hash).
inline Hash128 RootOfBlockTable(std::string_view table) { return HashBytes(table); }
// RootOfBlockTable(BlockTable(data, size)) without keeping the table.
Hash128 ChunkDigest(const void* data, size_t size);
// Entry `block` of a block table. REQUIRES: table.size() >= (block + 1) * kBlockHashBytes.
inline Hash128 BlockTableEntry(std::string_view table, size_t block) {
  return Hash128::FromBytes(table.substr(block * kBlockHashBytes, kBlockHashBytes));
}

// xxh3-64: the node's own checksums of sub-chunk blocks (never on the wire or in manifests).
uint64_t HashBytes64(const void* data, size_t size);

// Incremental xxh3-128 for data that arrives in pieces.
class StreamingHasher {
 public:
  StreamingHasher();
  ~StreamingHasher();
  StreamingHasher(const StreamingHasher&) = delete;
  StreamingHasher& operator=(const StreamingHasher&) = delete;
  void Update(const void* data, size_t size);
  Hash128 Digest() const;

 private:
  void* state_;  // XXH3_state_t*
};

}  // namespace shardcache
