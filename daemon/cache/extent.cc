#include "daemon/cache/extent.h"

#include <algorithm>
#include <cstring>

namespace shardcache::cache {

uint64_t TableBytes(uint64_t length) {
  if (length <= kVerifyBlockBytes) return 0;
  const uint64_t blocks = (length + kVerifyBlockBytes - 1) / kVerifyBlockBytes;
  return AlignUp(blocks * sizeof(uint64_t), kDirectIoAlign);
}

uint64_t ExtentBytes(uint64_t length) { return AlignUp(length, kDirectIoAlign) + TableBytes(length); }

AlignedBuffer BlockTable(const uint8_t* data, uint64_t length) {
  if (TableBytes(length) == 0) return AlignedBuffer();
  AlignedBuffer table(TableBytes(length));
  std::memset(table.data(), 0, table.size());
  auto* hashes = reinterpret_cast<uint64_t*>(table.data());
  for (uint64_t off = 0, b = 0; off < length; off += kVerifyBlockBytes, ++b) {
    hashes[b] = HashBytes64(data + off, std::min(kVerifyBlockBytes, length - off));
  }
  return table;
}

PieceRead PlanPieceRead(uint64_t offset, uint64_t length, uint64_t chunk_length, uint64_t stored_length,
                        const uint8_t* dest) {
  PieceRead r;
  const uint64_t padded = AlignUp(stored_length, kDirectIoAlign);
  r.whole = (offset == 0 && length == stored_length) || stored_length != chunk_length || TableBytes(stored_length) == 0;
  if (r.whole) {
    r.data_len = padded;
  } else {
    r.b0 = offset / kVerifyBlockBytes;
    r.b1 = (offset + length + kVerifyBlockBytes - 1) / kVerifyBlockBytes;
    r.data_off = r.b0 * kVerifyBlockBytes;
    r.data_len = std::min(r.b1 * kVerifyBlockBytes, padded) - r.data_off;
    r.table_off = AlignDown(r.b0 * sizeof(uint64_t), kDirectIoAlign);
    r.table_len = AlignUp(r.b1 * sizeof(uint64_t), kDirectIoAlign) - r.table_off;
  }
  r.direct = reinterpret_cast<uintptr_t>(dest) % kDirectIoAlign == 0 && offset == r.data_off && length == r.data_len;
  return r;
}

std::string VerifyPiece(const PieceRead& plan, const uint8_t* data, const uint8_t* table, uint64_t stored_length,
                        uint64_t chunk_length, const Hash128& chunk_hash) {
  if (stored_length != chunk_length) {
    return "stored length " + std::to_string(stored_length) + ", manifest says " + std::to_string(chunk_length);
  }
  if (plan.whole) {
    const Hash128 got = ChunkDigest(data, stored_length);
    return got == chunk_hash ? "" : "hash " + got.ToHex() + ", manifest says " + chunk_hash.ToHex();
  }
  const auto* hashes = reinterpret_cast<const uint64_t*>(table);
  for (uint64_t b = plan.b0; b < plan.b1; ++b) {
    const uint64_t start = b * kVerifyBlockBytes;
    const uint64_t n = std::min(kVerifyBlockBytes, stored_length - start);
    if (HashBytes64(data + (start - plan.data_off), n) != hashes[b - plan.table_off / sizeof(uint64_t)]) {
      return "block " + std::to_string(b) + " does not match its checksum";
    }
  }
  return "";
}

}  // namespace shardcache::cache
