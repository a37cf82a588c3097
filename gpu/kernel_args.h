// Plain structures shared by the CUDA kernels (kernels.cu) and their CPU references
// (reference.cc), so both sides read the same arguments with the same layout. No CUDA headers,
// no C++20: nvcc compiles this as C++17.
//
// Thread safety: plain values.
#pragma once

#include <cstdint>

namespace shardcache::gpu {

// Most channels an image conversion supports (RGB, RGBA, and a little more).
inline constexpr int kMaxImageChannels = 8;

// Per-channel affine map applied to a uint8 pixel value v: out = fma(v, scale[c], bias[c]).
// Built from mean/std (given on the 0..1 scale, torchvision's convention) as
// scale = 1 / (255 · std), bias = −mean / std, once on the host; kernels and reference then
// compute the same single correctly-rounded fma, so the float32 results agree bit for bit.
struct ImageAffine {
  float scale[kMaxImageChannels];
  float bias[kMaxImageChannels];
};

// One contiguous piece of a gather: bytes [src_offset, src_offset + bytes) of the source go to
// [dst_offset, dst_offset + bytes) of the destination.
struct GatherItem {
  uint64_t src_offset;
  uint64_t dst_offset;
  uint64_t bytes;
};
static_assert(sizeof(GatherItem) == 24, "GatherItem is uploaded to the device as raw bytes");

}  // namespace shardcache::gpu
