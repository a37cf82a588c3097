#include "gpu/reference.h"

#include <cmath>
#include <cstring>

namespace shardcache::gpu {

const char* DTypeName(DType t) {
  switch (t) {
    case DType::kUInt8: return "uint8";
    case DType::kUInt16: return "uint16";
    case DType::kUInt32: return "uint32";
    case DType::kInt64: return "int64";
    case DType::kFloat32: return "float32";
    case DType::kBFloat16: return "bfloat16";
  }
  return "?";
}

DLDataType ToDLDataType(DType t) {
  auto bits = static_cast<uint8_t>(DTypeBytes(t) * 8);
  switch (t) {
    case DType::kUInt8:
    case DType::kUInt16:
    case DType::kUInt32: return {kDLUInt, bits, 1};
    case DType::kInt64: return {kDLInt, bits, 1};
    case DType::kFloat32: return {kDLFloat, bits, 1};
    case DType::kBFloat16: return {kDLBfloat, bits, 1};
  }
  return {kDLUInt, 8, 1};
}

uint16_t FloatToBFloat16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  if (std::isnan(f)) return static_cast<uint16_t>((bits >> 16) | 0x0040);  // keep sign, force quiet
  // Round to nearest, ties to even: add 0x7FFF plus the lowest kept bit, then truncate.
  uint32_t lsb = (bits >> 16) & 1u;
  bits += 0x7FFFu + lsb;
  return static_cast<uint16_t>(bits >> 16);
}

float BFloat16ToFloat(uint16_t b) {
  uint32_t bits = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

void TokensToInt64Reference(const void* src, DType token_type, int64_t rows, int64_t row_tokens,
                            bool shift, int64_t* input, int64_t* target) {
  auto token = [&](int64_t r, int64_t t) -> int64_t {
    int64_t i = r * row_tokens + t;
    if (token_type == DType::kUInt16) return static_cast<const uint16_t*>(src)[i];
    return static_cast<const uint32_t*>(src)[i];
  };
  int64_t out_tokens = shift ? row_tokens - 1 : row_tokens;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t t = 0; t < out_tokens; ++t) {
      input[r * out_tokens + t] = token(r, t);
      if (shift) target[r * out_tokens + t] = token(r, t + 1);
    }
  }
}

ImageAffine MakeImageAffine(const float* mean, const float* std, int channels) {
  ImageAffine a{};
  for (int c = 0; c < channels && c < kMaxImageChannels; ++c) {
    a.scale[c] = 1.0f / (255.0f * std[c]);
    a.bias[c] = -mean[c] / std[c];
  }
  return a;
}

void ImageHwcToChwReference(const uint8_t* src, int64_t n, int64_t h, int64_t w, int channels,
                            const ImageAffine& affine, DType out_type, void* dst) {
  const int64_t plane = h * w;
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t p = 0; p < plane; ++p) {
      for (int c = 0; c < channels; ++c) {
        float v = static_cast<float>(src[(i * plane + p) * channels + c]);
        float out = std::fma(v, affine.scale[c], affine.bias[c]);
        int64_t o = (i * channels + c) * plane + p;
        if (out_type == DType::kFloat32) {
          static_cast<float*>(dst)[o] = out;
        } else {
          static_cast<uint16_t*>(dst)[o] = FloatToBFloat16(out);
        }
      }
    }
  }
}

void GatherReference(void* dst, const void* src, const GatherItem* items, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    std::memcpy(static_cast<uint8_t*>(dst) + items[i].dst_offset,
                static_cast<const uint8_t*>(src) + items[i].src_offset, items[i].bytes);
  }
}

}  // namespace shardcache::gpu
