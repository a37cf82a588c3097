// Launchers of the CUDA kernels: fused conversions, the device-tier gather and the spin kernel
// the GPU benchmark uses as a stand-in for a training step. Each launcher enqueues on `stream`
// and returns the launch's cudaError_t (as int, so this header needs no CUDA headers); callers
// turn it into a Status through CudaStatus. Only built and called when SHARDCACHE_HAVE_CUDA.
// The formulas are those of reference.h, which the tests hold the kernels to.
//
// Thread safety: launches may be issued from any thread; ordering is the stream's.
#pragma once

#include <cstdint>

#include "gpu/kernel_args.h"

struct CUstream_st;

namespace shardcache::gpu::kernels {

using NativeStream = CUstream_st*;

// token_bytes: 2 (uint16) or 4 (uint32). See TokensToInt64Reference.
int LaunchTokensToInt64(const void* src, int token_bytes, int64_t rows, int64_t row_tokens,
                        bool shift, int64_t* input, int64_t* target, NativeStream stream);

// out_bf16 false: float32 output. See ImageHwcToChwReference.
int LaunchImageHwcToChw(const uint8_t* src, int64_t n, int64_t h, int64_t w, int channels,
                        const ImageAffine& affine, bool out_bf16, void* dst, NativeStream stream);

// items: device memory holding n GatherItem. See GatherReference.
int LaunchGather(void* dst, const void* src, const GatherItem* items, int64_t n, NativeStream stream);

// Busy-waits on the device for `ns` nanoseconds (globaltimer), reading one byte of `touch`
// (may be null) so the step depends on its batch like a real one.
int LaunchSpin(uint64_t ns, const void* touch, NativeStream stream);

}  // namespace shardcache::gpu::kernels
