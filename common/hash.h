// Chunk hashes: xxh3-128 over a chunk's bytes, stored as 16 bytes (high 64 bits first,
// big-endian) in manifests and on the wire, and printed as 32 lowercase hex digits.
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
