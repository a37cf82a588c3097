// CPU reference implementations of the fused conversion kernels and the gather kernel.
//
// They define what the kernels in kernels.cu must compute: the tests compare the CUDA path
// against these on random inputs, and the host backend runs them directly. Written as plain
// loops over the documented formula, for obviousness rather than speed.
//
// Thread safety: pure functions over caller-owned memory.
#pragma once

#include <cstdint>

#include "gpu/dtype.h"
#include "gpu/kernel_args.h"

namespace shardcache::gpu {

// float → bfloat16 with round-to-nearest-even (what __float2bfloat16_rn does); NaN stays a
// quiet NaN, infinities and signed zeros are kept.
uint16_t FloatToBFloat16(float f);
float BFloat16ToFloat(uint16_t b);

// Tokens: `rows` rows of `row_tokens` unsigned tokens (token_type kUInt16 or kUInt32) widened to
// int64. Without shift: input[r][t] = src[r][t], shape [rows, row_tokens]; target unused.
// With shift (language-model pairs): input[r][t] = src[r][t], target[r][t] = src[r][t + 1],
// both [rows, row_tokens − 1].
// REQUIRES: row_tokens >= 2 when shift.
void TokensToInt64Reference(const void* src, DType token_type, int64_t rows, int64_t row_tokens,
                            bool shift, int64_t* input, int64_t* target);

// Builds the per-channel affine map of kernel_args.h from mean/std on the 0..1 scale.
// REQUIRES: 1 <= channels <= kMaxImageChannels, std[c] != 0.
ImageAffine MakeImageAffine(const float* mean, const float* std, int channels);

// Images: n images of h×w×c uint8 (HWC) → n×c×h×w (CHW) of out_type kFloat32 or kBFloat16, each
// value fma(v, scale[c], bias[c]) (bf16: that float rounded to nearest even).
void ImageHwcToChwReference(const uint8_t* src, int64_t n, int64_t h, int64_t w, int channels,
                            const ImageAffine& affine, DType out_type, void* dst);

// Gather: for each item, copies bytes src[src_offset, +bytes) to dst[dst_offset, +bytes).
void GatherReference(void* dst, const void* src, const GatherItem* items, int64_t n);

}  // namespace shardcache::gpu
