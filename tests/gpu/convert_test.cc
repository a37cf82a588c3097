// Converter: spec validation, and every conversion on the selected backend against the CPU
// reference on random inputs (host variant: the dispatch and shapes; [gpu]: the kernels).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <vector>

#include "gpu/convert.h"
#include "gpu/reference.h"
#include "test_util.h"

using namespace shardcache;
using namespace shardcache::gpu;

namespace {

// Runs the converter on `src` (host bytes) on the device and returns each output on the host.
std::vector<std::vector<uint8_t>> RunOnDevice(const Device& dev, const Converter& conv,
                                              const std::vector<uint8_t>& src, uint64_t records) {
  auto stream = Stream::Create(dev);
  REQUIRE(stream.ok());
  DeviceBuffer in = testing::ToDevice(dev, src.data(), src.size());
  std::vector<DeviceBuffer> outs;
  std::vector<void*> ptrs;
  for (const TensorDesc& d : conv.Outputs(records, src.size())) {
    auto b = DeviceBuffer::Allocate(dev, d.bytes());
    REQUIRE(b.ok());
    ptrs.push_back(b->data());
    outs.push_back(std::move(*b));
  }
  REQUIRE(conv.Run(*stream, in.data(), records, ptrs).ok());
  REQUIRE(stream->Synchronize().ok());
  std::vector<std::vector<uint8_t>> host;
  for (auto& o : outs) host.push_back(testing::ToHost(dev, o.data(), o.bytes()));
  return host;
}

void TokensMatchReference(bool cuda) {
  Device dev = testing::OpenDevice(cuda);
  for (DType tt : {DType::kUInt16, DType::kUInt32}) {
    for (bool shift : {false, true}) {
      DYNAMIC_SECTION(DTypeName(tt) << (shift ? " shifted" : " plain")) {
        const uint64_t row_tokens = 129, rows = 37;
        ConversionSpec spec;
        spec.kind = ConversionSpec::Kind::kTokens;
        spec.token_type = tt;
        spec.shift = shift;
        const uint64_t rb = row_tokens * DTypeBytes(tt);
        auto conv = Converter::Create(spec, rb);
        REQUIRE(conv.ok());
        auto src = testing::RandomBytes(rows * rb, 11 + static_cast<int>(tt) + shift);
        auto outs = RunOnDevice(dev, *conv, src, rows);
        const uint64_t ot = shift ? row_tokens - 1 : row_tokens;
        REQUIRE(outs.size() == (shift ? 2u : 1u));
        std::vector<int64_t> in(rows * ot), tgt(rows * ot);
        TokensToInt64Reference(src.data(), tt, rows, row_tokens, shift, in.data(), tgt.data());
        REQUIRE(outs[0].size() == in.size() * 8);
        CHECK(std::memcmp(outs[0].data(), in.data(), outs[0].size()) == 0);
        if (shift) CHECK(std::memcmp(outs[1].data(), tgt.data(), outs[1].size()) == 0);
        auto descs = conv->Outputs(rows, 0);
        CHECK(descs[0].shape == std::vector<int64_t>{static_cast<int64_t>(rows), static_cast<int64_t>(ot)});
        CHECK(descs[0].dtype == DType::kInt64);
      }
    }
  }
}

void ImagesMatchReference(bool cuda) {
  Device dev = testing::OpenDevice(cuda);
  for (DType out_type : {DType::kFloat32, DType::kBFloat16}) {
    DYNAMIC_SECTION("to " << DTypeName(out_type)) {
      ConversionSpec spec;
      spec.kind = ConversionSpec::Kind::kImage;
      spec.height = 17;
      spec.width = 23;
      spec.channels = 3;
      spec.mean = {0.485f, 0.456f, 0.406f};
      spec.std = {0.229f, 0.224f, 0.225f};
      spec.out_type = out_type;
      const uint64_t rb = 17 * 23 * 3, n = 5;
      auto conv = Converter::Create(spec, rb);
      REQUIRE(conv.ok());
      auto src = testing::RandomBytes(n * rb, 99);
      auto outs = RunOnDevice(dev, *conv, src, n);
      ImageAffine a = MakeImageAffine(spec.mean.data(), spec.std.data(), 3);
      const size_t elems = n * rb;
      if (out_type == DType::kFloat32) {
        std::vector<float> ref(elems), got(elems);
        ImageHwcToChwReference(src.data(), n, 17, 23, 3, a, out_type, ref.data());
        std::memcpy(got.data(), outs[0].data(), elems * 4);
        // Kernel and reference compute one fma from the same operands: equal, within a ulp
        // at most should a compiler ever split it.
        for (size_t i = 0; i < elems; ++i) {
          REQUIRE(got[i] == Approx(ref[i]).epsilon(2e-7).margin(1e-6));
        }
      } else {
        std::vector<uint16_t> ref(elems), got(elems);
        ImageHwcToChwReference(src.data(), n, 17, 23, 3, a, out_type, ref.data());
        std::memcpy(got.data(), outs[0].data(), elems * 2);
        // Same float, same rounding (nearest even): identical bits expected; allow one bf16
        // ulp for a float that lands on a rounding boundary after a one-ulp difference.
        for (size_t i = 0; i < elems; ++i) REQUIRE(std::abs(int(got[i]) - int(ref[i])) <= 1);
        size_t exact = 0;
        for (size_t i = 0; i < elems; ++i) exact += got[i] == ref[i];
        CHECK(exact >= elems - elems / 1000);
      }
      auto descs = conv->Outputs(n, 0);
      CHECK(descs[0].shape == std::vector<int64_t>{5, 3, 17, 23});
    }
  }
}

}  // namespace

TEST_CASE("converter rejects specs that do not fit the records", "[cuda][convert]") {
  ConversionSpec tokens;
  tokens.kind = ConversionSpec::Kind::kTokens;
  auto odd = Converter::Create(tokens, 7);
  REQUIRE_FALSE(odd.ok());
  CHECK(odd.status().code() == StatusCode::kInvalidArgument);
  CHECK_THAT(odd.status().message(), Catch::Contains("record_bytes 7"));
  tokens.token_type = DType::kFloat32;
  CHECK_THAT(Converter::Create(tokens, 8).status().message(), Catch::Contains("token_type"));
  tokens.token_type = DType::kUInt16;
  tokens.shift = true;
  CHECK_FALSE(Converter::Create(tokens, 2).ok());

  ConversionSpec img;
  img.kind = ConversionSpec::Kind::kImage;
  img.height = 4;
  img.width = 4;
  img.channels = 3;
  CHECK_THAT(Converter::Create(img, 47).status().message(), Catch::Contains("height*width*channels"));
  img.mean = {0.5f};
  CHECK_THAT(Converter::Create(img, 48).status().message(), Catch::Contains("one value per channel"));
  img.mean = {0, 0, 0};
  img.std = {1, 0, 1};
  CHECK_THAT(Converter::Create(img, 48).status().message(), Catch::Contains("std[1] is zero"));
  img.channels = 9;
  CHECK_THAT(Converter::Create(img, 144).status().message(), Catch::Contains("channels 9"));
}

TEST_CASE("token conversion on the host backend matches the reference", "[cuda][convert]") {
  TokensMatchReference(false);
}
TEST_CASE("token conversion kernels match the reference", "[cuda][convert][gpu]") { TokensMatchReference(true); }

TEST_CASE("image conversion on the host backend matches the reference", "[cuda][convert]") {
  ImagesMatchReference(false);
}
TEST_CASE("image conversion kernels match the reference", "[cuda][convert][gpu]") { ImagesMatchReference(true); }

TEST_CASE("the backend is chosen at run time", "[cuda][device]") {
  auto host = Device::Open({DeviceOptions::Select::kHost, 0});
  REQUIRE(host.ok());
  CHECK(host->backend() == Backend::kHost);
  auto any = Device::Open({});
  REQUIRE(any.ok());
  CHECK(any->is_cuda() == (VisibleCudaDevices() > 0));
  auto cuda = Device::Open({DeviceOptions::Select::kCuda, 0});
  if (VisibleCudaDevices() == 0) {
    REQUIRE_FALSE(cuda.ok());
    CHECK(cuda.status().code() == StatusCode::kUnavailable);
  } else {
    auto bad = Device::Open({DeviceOptions::Select::kCuda, 1000});
    CHECK(bad.status().code() == StatusCode::kInvalidArgument);
  }
}
