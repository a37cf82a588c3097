// Device-memory tier: epoch 1 fills it through the stager, later epochs are gathered from device
// memory byte-exact with no payload host→device traffic; shares that do not fit stay off.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "gpu/device_tier.h"
#include "gpu/reference.h"
#include "gpu/stager.h"
#include "test_util.h"

using namespace shardcache;
using namespace shardcache::gpu;
using gpu::testing::FakeArenaLoader;
using gpu::testing::MemfdArena;

namespace {

std::vector<int64_t> Permutation(size_t n, uint64_t seed) {
  std::vector<int64_t> v(n);
  std::iota(v.begin(), v.end(), 0);
  std::shuffle(v.begin(), v.end(), std::mt19937_64(seed));
  return v;
}

void ResidentAfterEpochOne(bool cuda, bool convert) {
  const uint64_t rb = 2 * 257, per_batch = 8, samples = 96;  // 257 uint16 tokens per record
  MemfdArena arena(4 * rb * per_batch);
  auto epoch1 = Permutation(samples, 1);
  FakeArenaLoader loader(arena, 4, rb, per_batch, samples / per_batch, epoch1);

  StagerOptions o;
  o.depth = 2;
  o.max_batch_bytes = rb * per_batch;
  o.record_bytes = rb;
  o.device.select = cuda ? gpu::DeviceOptions::Select::kCuda : gpu::DeviceOptions::Select::kHost;
  o.arena = arena.data();
  o.arena_bytes = arena.bytes();
  o.device_tier.budget_bytes = 1 << 20;
  o.share_bytes = rb * samples;
  o.share_samples = samples;
  if (convert) {
    o.conversion.kind = gpu::ConversionSpec::Kind::kTokens;
    o.conversion.shift = true;
  }
  auto stager = Stager::Create(o);
  REQUIRE(stager.ok());
  Stager& s = **stager;
  REQUIRE(s.has_device_tier());
  CHECK(s.AssembleResident(std::vector<int64_t>{0}).status().code() == StatusCode::kFailedPrecondition);

  REQUIRE(s.Start(loader.Source()).ok());
  for (;;) {
    auto b = s.Next();
    REQUIRE(b.ok());
    if (!b->has_value()) break;
  }
  REQUIRE(s.resident());

  const uint64_t payload_before = s.Stats().h2d_payload_bytes;
  const uint64_t index_before = s.Stats().h2d_index_bytes;

  auto epoch2 = Permutation(samples, 2);
  for (size_t k = 0; k < samples / per_batch; ++k) {
    std::vector<int64_t> ids(epoch2.begin() + k * per_batch, epoch2.begin() + (k + 1) * per_batch);
    auto b = s.AssembleResident(ids);
    REQUIRE(b.ok());
    CHECK(b->sample_ids() == ids);
    std::vector<uint8_t> raw;
    for (int64_t id : ids) {
      auto rec = loader.Record(id);
      raw.insert(raw.end(), rec.begin(), rec.end());
    }
    if (!convert) {
      REQUIRE(gpu::testing::ToHost(s.device(), b->tensor(0).data, b->tensor(0).bytes(), &b->ready()) == raw);
    } else {
      std::vector<int64_t> in(per_batch * 256), tgt(per_batch * 256);
      gpu::TokensToInt64Reference(raw.data(), gpu::DType::kUInt16, per_batch, 257, true, in.data(), tgt.data());
      auto got = gpu::testing::ToHost(s.device(), b->tensor(1).data, b->tensor(1).bytes(), &b->ready());
      REQUIRE(std::memcmp(got.data(), tgt.data(), got.size()) == 0);
    }
  }
  // Epoch 2 moved no payload host → device; only the per-batch index (24 bytes per sample).
  CHECK(s.Stats().h2d_payload_bytes == payload_before);
  CHECK(s.Stats().h2d_index_bytes - index_before == samples * sizeof(gpu::GatherItem));
  CHECK(s.Stats().batches_gathered == samples / per_batch);

  CHECK(s.AssembleResident(std::vector<int64_t>{static_cast<int64_t>(samples)}).status().code() ==
        StatusCode::kNotFound);
}

void GathersVariableSizeSamples(bool cuda) {
  gpu::Device dev = gpu::testing::OpenDevice(cuda);
  auto stream = gpu::Stream::Create(dev);
  REQUIRE(stream.ok());
  // Ten samples of 1..10·37 bytes in one batch, ingested, then gathered in reverse.
  std::vector<uint64_t> offsets, lengths;
  std::vector<int64_t> ids;
  uint64_t total = 0;
  for (int i = 0; i < 10; ++i) {
    ids.push_back(100 + i);
    offsets.push_back(total);
    lengths.push_back(37 * (i + 1));
    total += 37 * (i + 1);
  }
  auto host = gpu::testing::RandomBytes(total, 3);
  gpu::DeviceBuffer batch = gpu::testing::ToDevice(dev, host.data(), host.size());
  auto tier = gpu::DeviceTier::Create(dev, {.budget_bytes = total}, total, 10);
  REQUIRE(tier.ok());
  REQUIRE((*tier)->Ingest(*stream, batch.data(), ids, offsets, lengths).ok());
  // Duplicates are skipped, a sample beyond the share is refused.
  REQUIRE((*tier)->Ingest(*stream, batch.data(), std::vector<int64_t>{100}, std::vector<uint64_t>{0},
                          std::vector<uint64_t>{37})
              .ok());
  auto over = (*tier)->Ingest(*stream, batch.data(), std::vector<int64_t>{999}, std::vector<uint64_t>{0},
                              std::vector<uint64_t>{1});
  CHECK(over.code() == StatusCode::kResourceExhausted);
  CHECK((*tier)->complete());
  CHECK((*tier)->resident_bytes() == total);

  std::vector<int64_t> rev(ids.rbegin(), ids.rend());
  auto out = gpu::DeviceBuffer::Allocate(dev, total);
  REQUIRE(out.ok());
  std::vector<uint64_t> out_offsets;
  auto bytes = (*tier)->Gather(*stream, rev, out->data(), total, &out_offsets);
  REQUIRE(bytes.ok());
  CHECK(*bytes == total);
  REQUIRE(stream->Synchronize().ok());
  auto got = gpu::testing::ToHost(dev, out->data(), total);
  std::vector<uint8_t> expect;
  for (int i = 9; i >= 0; --i) expect.insert(expect.end(), host.begin() + offsets[i], host.begin() + offsets[i] + lengths[i]);
  CHECK(got == expect);
  CHECK(out_offsets.front() == 0);
  CHECK(out_offsets[1] == lengths[9]);
  CHECK((*tier)->Gather(*stream, rev, out->data(), total - 1).status().code() == StatusCode::kResourceExhausted);
}

}  // namespace

TEST_CASE("the device tier serves epoch 2 from device memory with no payload copied in", "[cuda][tier]") {
  ResidentAfterEpochOne(false, false);
}
TEST_CASE("the device tier serves converted batches in epoch 2", "[cuda][tier]") { ResidentAfterEpochOne(false, true); }
TEST_CASE("the device tier gathers on a GPU with no payload copied in after epoch 1", "[cuda][tier][gpu]") {
  ResidentAfterEpochOne(true, false);
  ResidentAfterEpochOne(true, true);
}

TEST_CASE("the device tier gathers variable-size samples byte-exact", "[cuda][tier]") {
  GathersVariableSizeSamples(false);
}
TEST_CASE("the gather kernel assembles variable-size samples byte-exact", "[cuda][tier][gpu]") {
  GathersVariableSizeSamples(true);
}

TEST_CASE("a share larger than the GPU budget gets no device tier", "[cuda][tier]") {
  auto t = gpu::DeviceTier::Create(gpu::Device::Host(), {.budget_bytes = 1000}, 1001, 10);
  REQUIRE_FALSE(t.ok());
  CHECK(t.status().code() == StatusCode::kResourceExhausted);
  CHECK_THAT(t.status().message(), Catch::Contains("does not fit"));

  StagerOptions o;
  o.max_batch_bytes = 100;
  o.device.select = gpu::DeviceOptions::Select::kHost;
  o.device_tier.budget_bytes = 1000;
  o.share_bytes = 5000;
  o.share_samples = 50;
  auto s = Stager::Create(o);
  REQUIRE(s.ok());
  CHECK_FALSE((*s)->has_device_tier());
  CHECK((*s)->AssembleResident(std::vector<int64_t>{1}).status().code() == StatusCode::kFailedPrecondition);
}
