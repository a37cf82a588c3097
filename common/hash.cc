#include "common/hash.h"

#include <algorithm>
#include <cstdint>

#include <xxhash.h>
#if defined(__x86_64__)
// Debian's libxxhash picks AVX-512 / AVX2 / SSE2 at run time (52 vs 17 GB/s for an inlined
// SSE2-only build on the dev machines): every chunk is hashed on arrival and on every read.
#include <xxh_x86dispatch.h>
#define SC_XXH3_128 XXH3_128bits_dispatch
#define SC_XXH3_64 XXH3_64bits_dispatch
#define SC_XXH3_128_UPDATE XXH3_128bits_update_dispatch
#else
#define SC_XXH3_128 XXH3_128bits
#define SC_XXH3_64 XXH3_64bits
#define SC_XXH3_128_UPDATE XXH3_128bits_update
#endif

namespace shardcache {

std::string Hash128::ToBytes() const {
  std::string out(16, '\0');
  for (int i = 0; i < 8; ++i) {
    out[i] = static_cast<char>(high >> (56 - 8 * i));
    out[8 + i] = static_cast<char>(low >> (56 - 8 * i));
  }
  return out;
}

std::string Hash128::ToHex() const {
  static const char* kDigits = "0123456789abcdef";
  const std::string b = ToBytes();
  std::string out(32, '0');
  for (int i = 0; i < 16; ++i) {
    out[2 * i] = kDigits[(static_cast<unsigned char>(b[i]) >> 4) & 0xF];
    out[2 * i + 1] = kDigits[static_cast<unsigned char>(b[i]) & 0xF];
  }
  return out;
}

Hash128 Hash128::FromBytes(std::string_view bytes) {
  Hash128 h;
  for (int i = 0; i < 8; ++i) {
    h.high = (h.high << 8) | static_cast<unsigned char>(bytes[i]);
    h.low = (h.low << 8) | static_cast<unsigned char>(bytes[8 + i]);
  }
  return h;
}

Hash128 HashBytes(const void* data, size_t size) {
  const XXH128_hash_t h = SC_XXH3_128(data, size);
  return Hash128{h.high64, h.low64};
}

std::string BlockTable(const void* data, size_t size) {
  const auto* bytes = static_cast<const uint8_t*>(data);
  std::string table(ChunkBlockCount(size) * kBlockHashBytes, '\0');
  for (size_t b = 0, off = 0; off < size; ++b, off += kChunkBlockBytes) {
    const XXH128_hash_t h = SC_XXH3_128(bytes + off, std::min(kChunkBlockBytes, size - off));
    char* out = table.data() + b * kBlockHashBytes;
    for (int i = 0; i < 8; ++i) {
      out[i] = static_cast<char>(h.high64 >> (56 - 8 * i));
      out[8 + i] = static_cast<char>(h.low64 >> (56 - 8 * i));
    }
  }
  return table;
}

Hash128 ChunkDigest(const void* data, size_t size) { return RootOfBlockTable(BlockTable(data, size)); }

uint64_t HashBytes64(const void* data, size_t size) { return SC_XXH3_64(data, size); }

StreamingHasher::StreamingHasher() : state_(XXH3_createState()) {
  XXH3_128bits_reset(static_cast<XXH3_state_t*>(state_));
}
StreamingHasher::~StreamingHasher() { XXH3_freeState(static_cast<XXH3_state_t*>(state_)); }
void StreamingHasher::Update(const void* data, size_t size) {
  SC_XXH3_128_UPDATE(static_cast<XXH3_state_t*>(state_), data, size);
}
Hash128 StreamingHasher::Digest() const {
  const XXH128_hash_t h = XXH3_128bits_digest(static_cast<XXH3_state_t*>(state_));
  return Hash128{h.high64, h.low64};
}

}  // namespace shardcache
