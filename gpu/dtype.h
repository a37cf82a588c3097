// Element types of staged tensors and their DLPack codes.
//
// DLPack is the ABI through which a DeviceBatch's tensors reach torch / numpy / cupy without a
// copy: the structures come from the packaged header (Debian libdlpack-dev, DLPack 0.6), whose
// DLManagedTensor is what every consumer of the legacy "dltensor" capsule understands.
//
// Thread safety: plain values and pure functions.
#pragma once

#include <dlpack/dlpack.h>

#include <cstddef>
#include <cstdint>

static_assert(sizeof(DLDataType) == 4, "DLPack ABI: DLDataType is 4 bytes");
static_assert(sizeof(DLDevice) == 8, "DLPack ABI: DLDevice is 8 bytes");
static_assert(sizeof(DLTensor) == 48, "DLPack ABI: DLTensor is 48 bytes on LP64");

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
