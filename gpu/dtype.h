// Element types of staged tensors and their DLPack codes.
//
// Thread safety: plain values and pure functions.
#pragma once

#include <cstddef>
#include <cstdint>

#include "gpu/dlpack.h"

namespace shardcache::gpu {

enum class DType : uint8_t { kUInt8, kUInt16, kUInt32, kInt64, kFloat32, kBFloat16 };

constexpr size_t DTypeBytes(DType t) {
  switch (t) {
    case DType::kUInt8: return 1;
    case DType::kUInt16: return 2;
    case DType::kBFloat16: return 2;
    case DType::kUInt32: return 4;
    case DType::kFloat32: return 4;
    case DType::kInt64: return 8;
  }
  return 0;
}

const char* DTypeName(DType t);
DLDataType ToDLDataType(DType t);

}  // namespace shardcache::gpu
