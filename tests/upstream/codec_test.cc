// Chunk codec: adaptive zstd per message, and a decoder that refuses hostile frames.
#include <zstd.h>

#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <catch2/catch.hpp>

#include "daemon/upstream/chunk_codec.h"

using namespace shardcache;
using namespace shardcache::upstream;

namespace {

std::string RandomBytes(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::string s(n, '\0');
  for (size_t i = 0; i < n; i += 8) {
    uint64_t v = rng();
    std::memcpy(&s[i], &v, std::min<size_t>(8, n - i));
  }
  return s;
}

std::string TextLike(size_t n) {
  std::string s;
  const char* words[] = {"shard ", "chunk ", "cache ", "epoch ", "tensor ", "sample "};
  std::mt19937 rng(7);
  while (s.size() < n) s += words[rng() % 6];
  s.resize(n);
  return s;
}

const uint8_t* U8(const std::string& s) { return reinterpret_cast<const uint8_t*>(s.data()); }

}  // namespace

TEST_CASE("compressible chunks travel as zstd and decode to the same bytes", "[codec]") {
  const std::string data = TextLike(1 << 20);
  ChunkEncoder enc;
  v1::ChunkMessage msg;
  enc.Encode(U8(data), data.size(), true, &msg);
  CHECK(msg.codec() == v1::ZSTD);
  CHECK(msg.raw_bytes() == data.size());
  CHECK(msg.payload().size() < data.size() / 4);
  ChunkDecoder dec;
  AlignedBuffer out;
  REQUIRE(dec.Decode(msg, data.size(), "test", &out).ok());
  REQUIRE(out.size() == data.size());
  CHECK(std::memcmp(out.data(), data.data(), data.size()) == 0);
}

TEST_CASE("incompressible chunks travel RAW and the encoder stops trying for a while", "[codec]") {
  ChunkEncoderOptions o;
  o.retry_every = 16;
  ChunkEncoder enc(o);
  for (int i = 0; i < 32; ++i) {
    const std::string data = RandomBytes(256 << 10, static_cast<uint64_t>(i));
    v1::ChunkMessage msg;
    enc.Encode(U8(data), data.size(), true, &msg);
    REQUIRE(msg.codec() == v1::RAW);
    REQUIRE(msg.payload() == data);
  }
  // 32 chunks: attempts at chunk 0 and 16, the other 30 skipped.
  CHECK(enc.skipped_attempts() == 30);
  // Both attempts were settled by the first 16 KiB alone.
  CHECK(enc.probe_refusals() == 2);
}

TEST_CASE("a large incompressible message is refused by its first 16 KiB; a compressible one is not", "[codec]") {
  ChunkEncoder enc;
  const std::string random = RandomBytes(1 << 20, 99);
  v1::ChunkMessage msg;
  enc.Encode(U8(random), random.size(), true, &msg);
  CHECK(msg.codec() == v1::RAW);
  CHECK(msg.payload() == random);
  CHECK(enc.probe_refusals() == 1);
  ChunkEncoder fresh;
  const std::string text = TextLike(1 << 20);
  fresh.Encode(U8(text), text.size(), true, &msg);
  CHECK(msg.codec() == v1::ZSTD);
  CHECK(fresh.probe_refusals() == 0);
  // Under 4x the probe: the whole message is tried, as before.
  ChunkEncoder small;
  const std::string piece = RandomBytes(32 << 10, 5);
  small.Encode(U8(piece), piece.size(), true, &msg);
  CHECK(msg.codec() == v1::RAW);
  CHECK(small.probe_refusals() == 0);
}

TEST_CASE("a client that does not accept zstd always gets RAW", "[codec]") {
  const std::string data = TextLike(100000);
  ChunkEncoder enc;
  v1::ChunkMessage msg;
  enc.Encode(U8(data), data.size(), false, &msg);
  CHECK(msg.codec() == v1::RAW);
  CHECK(msg.payload() == data);
}

TEST_CASE("the decoder rejects bad messages with DataLoss", "[codec]") {
  ChunkDecoder dec;
  AlignedBuffer out;
  const std::string data = TextLike(65536);
  ChunkEncoder enc;
  v1::ChunkMessage good;
  enc.Encode(U8(data), data.size(), true, &good);
  REQUIRE(good.codec() == v1::ZSTD);

  SECTION("raw_bytes that disagree with the manifest length") {
    Status s = dec.Decode(good, data.size() + 1, "chunk 3", &out);
    CHECK(s.code() == StatusCode::kDataLoss);
    CHECK_THAT(s.message(), Catch::Contains("chunk 3"));
  }
  SECTION("a RAW payload of the wrong size") {
    v1::ChunkMessage m;
    m.set_codec(v1::RAW);
    m.set_raw_bytes(10);
    m.set_payload("short");
    CHECK(dec.Decode(m, 10, "x", &out).code() == StatusCode::kDataLoss);
  }
  SECTION("garbage that is not a zstd frame") {
    v1::ChunkMessage m = good;
    m.set_payload(RandomBytes(1000, 3));
    CHECK(dec.Decode(m, data.size(), "x", &out).code() == StatusCode::kDataLoss);
  }
  SECTION("a truncated frame") {
    v1::ChunkMessage m = good;
    m.set_payload(good.payload().substr(0, good.payload().size() / 2));
    CHECK(dec.Decode(m, data.size(), "x", &out).code() == StatusCode::kDataLoss);
  }
  SECTION("trailing bytes after the frame") {
    v1::ChunkMessage m = good;
    m.set_payload(good.payload() + "junk");
    CHECK(dec.Decode(m, data.size(), "x", &out).code() == StatusCode::kDataLoss);
  }
  SECTION("an unknown codec") {
    v1::ChunkMessage m = good;
    m.set_codec(static_cast<v1::Codec>(7));
    CHECK(dec.Decode(m, data.size(), "x", &out).code() == StatusCode::kDataLoss);
  }
}

TEST_CASE("a decompression bomb is rejected without inflating it", "[codec]") {
  // 64 MiB of zeros compress to a few KiB; the manifest says the chunk has 64 KiB.
  const size_t bomb_bytes = 64 << 20;
  const std::string zeros(bomb_bytes, '\0');
  ZSTD_CCtx* cctx = ZSTD_createCCtx();
  std::string frame(ZSTD_compressBound(bomb_bytes), '\0');
  ChunkDecoder dec;
  AlignedBuffer out;
  v1::ChunkMessage m;
  m.set_codec(v1::ZSTD);
  m.set_raw_bytes(65536);

  SECTION("frame that declares its size") {
    size_t n = ZSTD_compressCCtx(cctx, frame.data(), frame.size(), zeros.data(), zeros.size(), 1);
    REQUIRE(!ZSTD_isError(n));
    m.set_payload(frame.substr(0, n));
    Status s = dec.Decode(m, 65536, "bomb", &out);
    CHECK(s.code() == StatusCode::kDataLoss);
    CHECK_THAT(s.message(), Catch::Contains("declares"));
  }
  SECTION("frame that hides its size") {
    ZSTD_CCtx_setParameter(cctx, ZSTD_c_contentSizeFlag, 0);
    size_t n = ZSTD_compress2(cctx, frame.data(), frame.size(), zeros.data(), zeros.size());
    REQUIRE(!ZSTD_isError(n));
    REQUIRE(n < 100000);
    m.set_payload(frame.substr(0, n));
    Status s = dec.Decode(m, 65536, "bomb", &out);
    CHECK(s.code() == StatusCode::kDataLoss);
    CHECK_THAT(s.message(), Catch::Contains("beyond"));
  }
  SECTION("frame that needs a window larger than the cap") {
    // A small valid frame whose header then claims a 1 GiB window (Window_Descriptor byte,
    // present because the frame has no content size: exponent 20 -> windowLog 30).
    ZSTD_CCtx_setParameter(cctx, ZSTD_c_contentSizeFlag, 0);
    const std::string small(65536, 'a');
    size_t n = ZSTD_compress2(cctx, frame.data(), frame.size(), small.data(), small.size());
    REQUIRE(!ZSTD_isError(n));
    std::string patched = frame.substr(0, n);
    REQUIRE((static_cast<uint8_t>(patched[4]) & 0x20) == 0);  // not single-segment
    patched[5] = static_cast<char>(20 << 3);
    m.set_payload(patched);
    Status s = dec.Decode(m, 65536, "wide", &out);
    CHECK(s.code() == StatusCode::kDataLoss);
    CHECK_THAT(s.message(), Catch::Contains("rejected"));
  }
  ZSTD_freeCCtx(cctx);
}

TEST_CASE("decoders share their thread's zstd context: a rejected frame leaves nothing behind, every thread keeps "
          "the window cap",
          "[codec]") {
  const std::string data = TextLike(65536);
  ChunkEncoder enc;
  v1::ChunkMessage good;
  enc.Encode(U8(data), data.size(), true, &good);
  REQUIRE(good.codec() == v1::ZSTD);
  // The same frame cut short, then claiming a window past the cap (see the bomb test).
  v1::ChunkMessage truncated = good;
  truncated.set_payload(good.payload().substr(0, good.payload().size() / 2));
  v1::ChunkMessage wide = good;
  {
    ZSTD_CCtx* cctx = ZSTD_createCCtx();
    ZSTD_CCtx_setParameter(cctx, ZSTD_c_contentSizeFlag, 0);
    std::string frame(ZSTD_compressBound(data.size()), '\0');
    const size_t n = ZSTD_compress2(cctx, frame.data(), frame.size(), data.data(), data.size());
    ZSTD_freeCCtx(cctx);
    REQUIRE(!ZSTD_isError(n));
    frame.resize(n);
    REQUIRE((static_cast<uint8_t>(frame[4]) & 0x20) == 0);
    frame[5] = static_cast<char>(20 << 3);
    wide.set_payload(frame);
  }
  auto decode_all = [&](int rounds) {
    int exact = 0, refused = 0;
    for (int i = 0; i < rounds; ++i) {
      AlignedBuffer out;
      // A decoder per message, as a fetch makes one per task.
      if (ChunkDecoder().Decode(truncated, data.size(), "cut", &out).code() == StatusCode::kDataLoss) ++refused;
      if (ChunkDecoder().Decode(wide, data.size(), "wide", &out).code() == StatusCode::kDataLoss) ++refused;
      ChunkDecoder dec;
      if (dec.Decode(good, data.size(), "good", &out).ok() && out.size() == data.size() &&
          std::memcmp(out.data(), data.data(), data.size()) == 0) {
        ++exact;
      }
    }
    return std::pair<int, int>{exact, refused};
  };
  CHECK(decode_all(20) == std::pair<int, int>{20, 40});
  std::vector<std::pair<int, int>> got(4);
  std::vector<std::thread> threads;
  for (size_t t = 0; t < got.size(); ++t) threads.emplace_back([&, t] { got[t] = decode_all(20); });
  for (auto& th : threads) th.join();
  for (const auto& g : got) CHECK(g == std::pair<int, int>{20, 40});
}
