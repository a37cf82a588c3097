// DLPack: the ABI through which a DeviceBatch's tensors are handed to torch / numpy / cupy
// without a copy. These are the structures of DLPack v0.8 (dlpack/include/dlpack/dlpack.h,
// Apache-2.0), which every consumer of the legacy "dltensor" capsule understands. The layout
// is the contract, so the definitions below must not change; no Debian package ships the
// header, hence this copy. Guarded by the same macro as the upstream header so that a
// translation unit which also includes the upstream one sees one definition.
#pragma once

#ifndef DLPACK_VERSION
#define DLPACK_VERSION 80
#define DLPACK_ABI_VERSION 1

#include <cstddef>
#include <cstdint>

extern "C" {

typedef enum {
  kDLCPU = 1,
  kDLCUDA = 2,
  kDLCUDAHost = 3,
  kDLOpenCL = 4,
  kDLVulkan = 7,
  kDLMetal = 8,
  kDLVPI = 9,
  kDLROCM = 10,
  kDLROCMHost = 11,
  kDLExtDev = 12,
  kDLCUDAManaged = 13,
  kDLOneAPI = 14,
  kDLWebGPU = 15,
  kDLHexagon = 16,
} DLDeviceType;

typedef struct {
  DLDeviceType device_type;
  int32_t device_id;
} DLDevice;

typedef enum {
  kDLInt = 0U,
  kDLUInt = 1U,
  kDLFloat = 2U,
  kDLOpaqueHandle = 3U,
  kDLBfloat = 4U,
  kDLComplex = 5U,
  kDLBool = 6U,
} DLDataTypeCode;

typedef struct {
  uint8_t code;
  uint8_t bits;
  uint16_t lanes;
} DLDataType;

typedef struct {
  void* data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t* shape;
  int64_t* strides;  // NULL: compact row-major
  uint64_t byte_offset;
} DLTensor;

typedef struct DLManagedTensor {
  DLTensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(struct DLManagedTensor* self);
} DLManagedTensor;

}  // extern "C"

static_assert(sizeof(DLDataType) == 4, "DLPack ABI: DLDataType is 4 bytes");
static_assert(sizeof(DLDevice) == 8, "DLPack ABI: DLDevice is 8 bytes");
static_assert(sizeof(DLTensor) == 48, "DLPack ABI: DLTensor is 48 bytes on LP64");

#endif  // DLPACK_VERSION
