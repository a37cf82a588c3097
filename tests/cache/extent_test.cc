// The extent layout's pure functions (daemon/cache/extent.h): sizes, the block table, the plan
// of a piece read (whole or covering blocks, direct or bounced) and its verification — which
// must name a corrupt block, a wrong stored length and a wrong whole-chunk hash.
#include <catch2/catch.hpp>

#include <cstring>
#include <random>
#include <vector>

#include "daemon/cache/extent.h"

using namespace shardcache;
using namespace shardcache::cache;

namespace {

constexpr uint64_t kBlock = kVerifyBlockBytes;

std::vector<uint8_t> RandomBytes(uint64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

}  // namespace

TEST_CASE("extent: sizes of the padded data and the block table") {
  CHECK(TableBytes(1) == 0);
  CHECK(TableBytes(kBlock) == 0);  // one block: no table
  CHECK(TableBytes(kBlock + 1) == kDirectIoAlign);
  CHECK(TableBytes(512 * kBlock) == kDirectIoAlign);      // 512 hashes = 4 KiB
  CHECK(TableBytes(512 * kBlock + 1) == 2 * kDirectIoAlign);
  CHECK(ExtentBytes(100) == kDirectIoAlign);
  CHECK(ExtentBytes(4 << 20) == (4u << 20) + kDirectIoAlign);
}

TEST_CASE("extent: a whole chunk, a one-block chunk or a stored length that differs is planned whole") {
  alignas(4096) static uint8_t dest[4096];
  const uint64_t len = 4 * kBlock + 1234;
  PieceRead whole = PlanPieceRead(0, len, len, len, dest);
  CHECK(whole.whole);
  CHECK(whole.data_off == 0);
  CHECK(whole.data_len == AlignUp(len, kDirectIoAlign));
  CHECK(PlanPieceRead(10, 20, kBlock, kBlock, dest).whole);          // one block: no table
  CHECK(PlanPieceRead(10, 20, len, len - 1, dest).whole);            // stored length differs
}

TEST_CASE("extent: a partial piece reads its covering blocks and their table page") {
  alignas(4096) static uint8_t aligned[2 * 65536];
  const uint64_t len = 8 * kBlock + 1234;
  // Bytes [kBlock + 10, 3 kBlock - 5): blocks 1 and 2.
  PieceRead p = PlanPieceRead(kBlock + 10, 2 * kBlock - 15, len, len, aligned);
  CHECK_FALSE(p.whole);
  CHECK(p.b0 == 1);
  CHECK(p.b1 == 3);
  CHECK(p.data_off == kBlock);
  CHECK(p.data_len == 2 * kBlock);
  CHECK(p.table_off == 0);
  CHECK(p.table_len == kDirectIoAlign);
  CHECK_FALSE(p.direct);  // does not start on its block
  // Exactly blocks 1-2 into an aligned buffer: straight into dest.
  CHECK(PlanPieceRead(kBlock, 2 * kBlock, len, len, aligned).direct);
  CHECK_FALSE(PlanPieceRead(kBlock, 2 * kBlock, len, len, aligned + 8).direct);
  // The last, short block: the read stops at the padded end of the data.
  PieceRead last = PlanPieceRead(8 * kBlock, 1234, len, len, aligned);
  CHECK(last.b0 == 8);
  CHECK(last.data_len == AlignUp(len, kDirectIoAlign) - 8 * kBlock);
}

TEST_CASE("extent: verification accepts good bytes and names what is wrong") {
  const uint64_t len = 8 * kBlock + 1234;
  const std::vector<uint8_t> chunk = RandomBytes(len, 7);
  const Hash128 hash = ChunkDigest(chunk.data(), len);
  const AlignedBuffer table = BlockTable(chunk.data(), len);
  REQUIRE(table.size() == TableBytes(len));

  PieceRead p = PlanPieceRead(2 * kBlock + 5, kBlock, len, len, nullptr);
  std::vector<uint8_t> data(chunk.begin() + static_cast<long>(p.data_off),
                            chunk.begin() + static_cast<long>(p.data_off + std::min(p.data_len, len - p.data_off)));
  CHECK(VerifyPiece(p, data.data(), table.data() + p.table_off, len, len, hash).empty());
  data[kBlock + 3] ^= 1;  // in block 3
  CHECK(VerifyPiece(p, data.data(), table.data() + p.table_off, len, len, hash) == "block 3 does not match its checksum");

  PieceRead whole = PlanPieceRead(0, len, len, len, nullptr);
  std::vector<uint8_t> copy = chunk;
  CHECK(VerifyPiece(whole, copy.data(), nullptr, len, len, hash).empty());
  copy[len - 1] ^= 1;
  CHECK(VerifyPiece(whole, copy.data(), nullptr, len, len, hash).find("manifest says") != std::string::npos);
  CHECK(VerifyPiece(whole, chunk.data(), nullptr, len - 1, len, hash).find("stored length") == 0);
}
