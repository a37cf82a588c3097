#include "gpu/convert.h"

#include "gpu/reference.h"

#if SHARDCACHE_HAVE_CUDA
#include "gpu/cuda_status.h"
#include "gpu/kernels.h"
#endif

namespace shardcache::gpu {

uint64_t TensorDesc::bytes() const {
  uint64_t n = DTypeBytes(dtype);
  for (int64_t d : shape) n *= static_cast<uint64_t>(d);
  return n;
}

Result<Converter> Converter::Create(const ConversionSpec& spec, uint64_t record_bytes) {
  using Kind = ConversionSpec::Kind;
  Converter c;
  c.spec_ = spec;
  c.record_bytes_ = record_bytes;
  switch (spec.kind) {
    case Kind::kNone:
      return c;
    case Kind::kTokens: {
      if (spec.token_type != DType::kUInt16 && spec.token_type != DType::kUInt32) {
        return InvalidArgument(std::string("token conversion: token_type must be uint16 or uint32, not ") +
                               DTypeName(spec.token_type));
      }
      const uint64_t tb = DTypeBytes(spec.token_type);
      if (record_bytes == 0 || record_bytes % tb != 0) {
        return InvalidArgument("token conversion: record_bytes " + std::to_string(record_bytes) +
                               " is not a positive multiple of the token size " + std::to_string(tb));
      }
      if (spec.shift && record_bytes / tb < 2) {
        return InvalidArgument("token conversion: shift needs at least 2 tokens per record");
      }
      return c;
    }
    case Kind::kImage: {
      if (spec.channels < 1 || spec.channels > kMaxImageChannels) {
        return InvalidArgument("image conversion: channels " + std::to_string(spec.channels) +
                               " outside 1.." + std::to_string(kMaxImageChannels));
      }
      if (spec.height <= 0 || spec.width <= 0) return InvalidArgument("image conversion: height and width must be positive");
      const uint64_t expect = static_cast<uint64_t>(spec.height * spec.width * spec.channels);
      if (record_bytes != expect) {
        return InvalidArgument("image conversion: record_bytes " + std::to_string(record_bytes) +
                               " != height*width*channels = " + std::to_string(expect));
      }
      if (spec.out_type != DType::kFloat32 && spec.out_type != DType::kBFloat16) {
        return InvalidArgument(std::string("image conversion: out_type must be float32 or bfloat16, not ") +
                               DTypeName(spec.out_type));
      }
      std::vector<float> mean = spec.mean, std = spec.std;
      if (mean.empty()) mean.assign(spec.channels, 0.0f);
      if (std.empty()) std.assign(spec.channels, 1.0f);
      if (mean.size() != static_cast<size_t>(spec.channels) || std.size() != static_cast<size_t>(spec.channels)) {
        return InvalidArgument("image conversion: mean and std need one value per channel (" +
                               std::to_string(spec.channels) + ")");
      }
      for (int i = 0; i < spec.channels; ++i) {
        if (!(std[i] != 0.0f)) return InvalidArgument("image conversion: std[" + std::to_string(i) + "] is zero");
      }
      c.affine_ = MakeImageAffine(mean.data(), std.data(), spec.channels);
      return c;
    }
  }
  return InvalidArgument("unknown conversion kind");
}

std::vector<TensorDesc> Converter::Outputs(uint64_t records, uint64_t bytes) const {
  using Kind = ConversionSpec::Kind;
  const auto n = static_cast<int64_t>(records);
  switch (spec_.kind) {
    case Kind::kNone:
      if (record_bytes_ == 0) return {TensorDesc{DType::kUInt8, {static_cast<int64_t>(bytes)}}};
      return {TensorDesc{DType::kUInt8, {n, static_cast<int64_t>(record_bytes_)}}};
    case Kind::kTokens: {
      const auto t = static_cast<int64_t>(record_bytes_ / DTypeBytes(spec_.token_type));
      if (spec_.shift) return {TensorDesc{DType::kInt64, {n, t - 1}}, TensorDesc{DType::kInt64, {n, t - 1}}};
      return {TensorDesc{DType::kInt64, {n, t}}};
    }
    case Kind::kImage:
      return {TensorDesc{spec_.out_type, {n, spec_.channels, spec_.height, spec_.width}}};
  }
  return {};
}

Status Converter::Run(const Stream& stream, const void* src, uint64_t records,
                      std::span<void* const> outputs) const {
  using Kind = ConversionSpec::Kind;
  if (identity()) return FailedPrecondition("Converter::Run on the identity conversion");
  const size_t want = Outputs(records, 0).size();
  if (outputs.size() != want) {
    return InvalidArgument("conversion needs " + std::to_string(want) + " output buffers, got " +
                           std::to_string(outputs.size()));
  }
  const auto rows = static_cast<int64_t>(records);
#if SHARDCACHE_HAVE_CUDA
  if (stream.native() != nullptr) {
    int err = 0;
    if (spec_.kind == Kind::kTokens) {
      err = kernels::LaunchTokensToInt64(src, static_cast<int>(DTypeBytes(spec_.token_type)), rows,
                                         static_cast<int64_t>(record_bytes_ / DTypeBytes(spec_.token_type)),
                                         spec_.shift, static_cast<int64_t*>(outputs[0]),
                                         spec_.shift ? static_cast<int64_t*>(outputs[1]) : nullptr,
                                         stream.native());
    } else {
      err = kernels::LaunchImageHwcToChw(static_cast<const uint8_t*>(src), rows, spec_.height, spec_.width,
                                         spec_.channels, affine_, spec_.out_type == DType::kBFloat16,
                                         outputs[0], stream.native());
    }
    if (err != 0) return CudaStatus(static_cast<cudaError_t>(err), "conversion kernel launch");
    return Status::Ok();
  }
#endif
  if (spec_.kind == Kind::kTokens) {
    TokensToInt64Reference(src, spec_.token_type, rows,
                           static_cast<int64_t>(record_bytes_ / DTypeBytes(spec_.token_type)), spec_.shift,
                           static_cast<int64_t*>(outputs[0]),
                           spec_.shift ? static_cast<int64_t*>(outputs[1]) : nullptr);
  } else {
    ImageHwcToChwReference(static_cast<const uint8_t*>(src), rows, spec_.height, spec_.width, spec_.channels,
                           affine_, spec_.out_type, outputs[0]);
  }
  return Status::Ok();
}

}  // namespace shardcache::gpu
