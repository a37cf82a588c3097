// The CPU references define what the kernels compute; these cases pin them to hand-worked
// values and to the documented formulas.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "gpu/reference.h"
#include "test_util.h"

using namespace shardcache::gpu;

TEST_CASE("bfloat16 conversion rounds to nearest even and keeps specials", "[cuda][reference]") {
  CHECK(FloatToBFloat16(1.0f) == 0x3F80);
  CHECK(FloatToBFloat16(-2.0f) == 0xC000);
  CHECK(FloatToBFloat16(0.0f) == 0x0000);
  CHECK(FloatToBFloat16(-0.0f) == 0x8000);
  CHECK(FloatToBFloat16(std::numeric_limits<float>::infinity()) == 0x7F80);
  // 1 + 2^-8 lies exactly halfway between bf16 1.0 (0x3F80) and 1.0078125 (0x3F81): ties go to
  // the even mantissa, 0x3F80. 1 + 3·2^-8 is halfway between 0x3F81 and 0x3F82: goes up to even.
  CHECK(FloatToBFloat16(1.0f + std::ldexp(1.0f, -8)) == 0x3F80);
  CHECK(FloatToBFloat16(1.0f + 3 * std::ldexp(1.0f, -8)) == 0x3F82);
  // Just above halfway rounds up.
  CHECK(FloatToBFloat16(1.0f + std::ldexp(1.0f, -8) + std::ldexp(1.0f, -20)) == 0x3F81);
  uint16_t nan = FloatToBFloat16(std::numeric_limits<float>::quiet_NaN());
  CHECK(std::isnan(BFloat16ToFloat(nan)));
  // The largest float rounds to infinity, as __float2bfloat16_rn does.
  CHECK(FloatToBFloat16(std::numeric_limits<float>::max()) == 0x7F80);
  for (float f : {0.5f, 3.140625f, -1024.0f, 1e-3f}) {
    CHECK(std::fabs(BFloat16ToFloat(FloatToBFloat16(f)) - f) <= std::fabs(f) * std::ldexp(1.0f, -8));
  }
}

TEST_CASE("token reference widens uint16 rows and builds shifted input/target pairs", "[cuda][reference]") {
  const std::vector<uint16_t> src = {1, 2, 3, 65535, 10, 20, 30, 40};  // 2 rows of 4
  std::vector<int64_t> in(8), tgt(8);
  TokensToInt64Reference(src.data(), DType::kUInt16, 2, 4, false, in.data(), nullptr);
  CHECK(in == std::vector<int64_t>{1, 2, 3, 65535, 10, 20, 30, 40});

  std::vector<int64_t> in3(6), tgt3(6);
  TokensToInt64Reference(src.data(), DType::kUInt16, 2, 4, true, in3.data(), tgt3.data());
  CHECK(in3 == std::vector<int64_t>{1, 2, 3, 10, 20, 30});
  CHECK(tgt3 == std::vector<int64_t>{2, 3, 65535, 20, 30, 40});
}

TEST_CASE("token reference keeps uint32 ids above 2^31 positive", "[cuda][reference]") {
  const std::vector<uint32_t> src = {0xFFFFFFFFu, 0x80000000u, 7};
  std::vector<int64_t> in(3);
  TokensToInt64Reference(src.data(), DType::kUInt32, 1, 3, false, in.data(), nullptr);
  CHECK(in == std::vector<int64_t>{4294967295LL, 2147483648LL, 7});
}

TEST_CASE("image reference transposes HWC to CHW and normalises per channel", "[cuda][reference]") {
  const int h = 3, w = 5, c = 3, n = 2;
  auto src = testing::RandomBytes(n * h * w * c, 7);
  const float mean[3] = {0.485f, 0.456f, 0.406f};
  const float stdv[3] = {0.229f, 0.224f, 0.225f};
  ImageAffine a = MakeImageAffine(mean, stdv, c);
  std::vector<float> out(n * c * h * w);
  ImageHwcToChwReference(src.data(), n, h, w, c, a, DType::kFloat32, out.data());
  for (int i = 0; i < n; ++i) {
    for (int y = 0; y < h; ++y) {
      for (int x = 0; x < w; ++x) {
        for (int ch = 0; ch < c; ++ch) {
          float v = src[((i * h + y) * w + x) * c + ch];
          float expect = (v / 255.0f - mean[ch]) / stdv[ch];  // the textbook formula
          float got = out[((i * c + ch) * h + y) * w + x];
          REQUIRE(got == Approx(expect).margin(1e-5).epsilon(1e-5));
        }
      }
    }
  }
  // bfloat16 output is the float32 output rounded to nearest even.
  std::vector<uint16_t> bf(out.size());
  ImageHwcToChwReference(src.data(), n, h, w, c, a, DType::kBFloat16, bf.data());
  for (size_t i = 0; i < out.size(); ++i) REQUIRE(bf[i] == FloatToBFloat16(out[i]));
}

TEST_CASE("gather reference copies each item to its destination", "[cuda][reference]") {
  const std::vector<uint8_t> src = {'a', 'b', 'c', 'd', 'e', 'f', 'g', 'h'};
  std::vector<uint8_t> dst(6, '.');
  const GatherItem items[] = {{6, 0, 2}, {0, 2, 3}, {3, 5, 1}};
  GatherReference(dst.data(), src.data(), items, 3);
  CHECK(std::string(dst.begin(), dst.end()) == "ghabcd");
}
