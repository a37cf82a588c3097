// Extent: how one chunk lies in a segment file, and the pure functions that plan and verify a
// read of part of it (NvmeStore reads, NvmeWriter writes, and both keep the books).
//
// An extent (index format 2) is the chunk bytes padded to 4 KiB, then a block table — xxh3-64
// of each kVerifyBlockBytes block of the chunk, padded to 4 KiB. A chunk of one block has no
// table: any piece of it is read whole and checked against the manifest hash. The table lets a
// sub-chunk read stay cheap and verified: a 64 KiB sample of a 4 MiB chunk reads its covering
// block(s) and one table page, not 4 MiB.
#pragma once

#include <cstdint>
#include <string>

#include "common/fs.h"
#include "common/hash.h"

namespace shardcache::cache {

// Size of the blocks the node checksums inside each stored chunk.
constexpr uint64_t kVerifyBlockBytes = 64 << 10;

// Bytes of a chunk's block table on disk (0 for a chunk of one block).
uint64_t TableBytes(uint64_t length);
// Bytes one chunk of `length` bytes occupies in a segment: data and block table, each padded
// to 4 KiB.
uint64_t ExtentBytes(uint64_t length);
// The block table of `length` bytes at `data`, padded with zeros to TableBytes(length).
AlignedBuffer BlockTable(const uint8_t* data, uint64_t length);

// How to read bytes [offset, offset + length) of a stored chunk of `stored_length` bytes
// whose manifest length is `chunk_length`, into `dest`.
struct PieceRead {
  bool whole = false;       // the whole chunk is read, verified against the manifest hash
  bool direct = false;      // the data lands in dest itself (no bounce buffer, no copy)
  uint64_t b0 = 0, b1 = 0;  // blocks covered (a partial read)
  uint64_t data_off = 0;    // read start within the chunk (block aligned; 0 when whole)
  uint64_t data_len = 0;    // read length (a 4 KiB multiple)
  uint64_t table_off = 0;   // read start within the block table (4 KiB aligned)
  uint64_t table_len = 0;   // table bytes to read (0 when whole)
};
// REQUIRES: offset + length <= chunk_length. A stored length that differs from the manifest's
// is planned whole (it then fails VerifyPiece's length check).
PieceRead PlanPieceRead(uint64_t offset, uint64_t length, uint64_t chunk_length, uint64_t stored_length,
                        const uint8_t* dest);

// Checks what a PieceRead brought in: `data` holds the read bytes (from plan.data_off), `table`
// the table bytes read (from plan.table_off; unused when whole). "" when good, else what is
// wrong (for the log).
std::string VerifyPiece(const PieceRead& plan, const uint8_t* data, const uint8_t* table, uint64_t stored_length,
                        uint64_t chunk_length, const Hash128& chunk_hash);

}  // namespace shardcache::cache
