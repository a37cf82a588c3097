// The one adapter from cudaError_t to shardcache::Status (style rule 3). Internal to gpu/:
// only translation units built with SHARDCACHE_HAVE_CUDA include it.
//
// Mapping: out of memory → ResourceExhausted; no device / insufficient driver / device
// unavailable → Unavailable; invalid value or device ordinal → InvalidArgument; not ready →
// Unavailable (retryable); anything else → Internal. The message is "what: cudaErrorName:
// description". Sticky errors (an illegal address in a kernel) stay Internal: the context is
// unusable and the process should not retry.
//
// Thread safety: a pure function.
#pragma once

#if SHARDCACHE_HAVE_CUDA
#include <cuda_runtime_api.h>

#include <string_view>

#include "common/status.h"

namespace shardcache::gpu {

Status CudaStatus(cudaError_t err, std::string_view what);

}  // namespace shardcache::gpu

// Evaluates a CUDA runtime call; returns its Status from the enclosing function when it failed.
#define SC_CUDA_RETURN_IF_ERROR(call, what)                                \
  do {                                                                     \
    cudaError_t sc_cuda_err_ = (call);                                     \
    if (sc_cuda_err_ != cudaSuccess) return ::shardcache::gpu::CudaStatus(sc_cuda_err_, what); \
  } while (0)

#endif  // SHARDCACHE_HAVE_CUDA
