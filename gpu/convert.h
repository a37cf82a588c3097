// Converter: the fused preprocessing step a loader selects, run on the staging stream right
// after a batch's bytes reach the device, so the trainer receives model-ready tensors.
//
//   kNone    raw bytes: one uint8 tensor [records, record_bytes] ([bytes] for variable-size
//            samples); the staged buffer itself, no kernel.
//   kTokens  uint16/uint32 token rows → int64 [records, T]; with shift, an (input, target)
//            pair [records, T−1] each, target = input moved one token left (LM training).
//   kImage   uint8 HWC images → float32 or bfloat16 CHW, normalized by per-channel mean/std.
//
// On CUDA the kernels of kernels.cu run; on host the references of reference.cc, which define
// the results. Thread safety: immutable after Create; Run may be called concurrently.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "gpu/device.h"
#include "gpu/dtype.h"
#include "gpu/kernel_args.h"

namespace shardcache::gpu {

struct ConversionSpec {
  enum class Kind { kNone, kTokens, kImage };
  Kind kind = Kind::kNone;

  // kTokens: element type of the stored tokens (kUInt16 or kUInt32). Default: kUInt16.
  DType token_type = DType::kUInt16;
  // kTokens: emit (input, target) pairs shifted by one token. Default: false.
  bool shift = false;

  // kImage: geometry of one record (record_bytes must equal height·width·channels).
  int64_t height = 0;
  int64_t width = 0;
  int channels = 3;
  // kImage: per-channel mean and std on the 0..1 scale; empty = mean 0, std 1 (plain /255).
  std::vector<float> mean;
  std::vector<float> std;
  // kImage: kFloat32 or kBFloat16. Default: kFloat32.
  DType out_type = DType::kFloat32;
};

struct TensorDesc {
  DType dtype = DType::kUInt8;
  std::vector<int64_t> shape;
  uint64_t bytes() const;
};

class Converter {
 public:
  // Validates the spec against the loader's record size (0 = variable-size samples, allowed
  // only for kNone); InvalidArgument names the field that is wrong.
  static Result<Converter> Create(const ConversionSpec& spec, uint64_t record_bytes);

  const ConversionSpec& spec() const { return spec_; }
  uint64_t record_bytes() const { return record_bytes_; }
  // True for kNone: the output tensor is the staged buffer itself.
  bool identity() const { return spec_.kind == ConversionSpec::Kind::kNone; }
  // The tensors a batch of `records` records (or `bytes` bytes when variable-size) becomes.
  std::vector<TensorDesc> Outputs(uint64_t records, uint64_t bytes) const;
  // Converts `records` records at src (device memory) into outputs[i] (device memory of at
  // least Outputs(records)[i].bytes()), enqueued on `stream`.
  // REQUIRES: !identity(); outputs.size() == Outputs(...).size().
  Status Run(const Stream& stream, const void* src, uint64_t records, std::span<void* const> outputs) const;

 private:
  ConversionSpec spec_;
  uint64_t record_bytes_ = 0;
  ImageAffine affine_{};
};

}  // namespace shardcache::gpu
