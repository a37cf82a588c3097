// Stager: byte-exact staging at every depth, registered and bounced; host slots released only
// after their copy and on the stager's own thread; device slots never reused under a live batch;
// conversions, DLPack export and error paths. Each case runs on the host backend, and on a GPU
// in its [gpu] variant.
#include <catch2/catch.hpp>

#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "gpu/reference.h"
#include "gpu/stager.h"
#include "python/src/loader_source.h"
#include "test_util.h"

using namespace shardcache;
using namespace shardcache::gpu;
using gpu::testing::FakeArenaLoader;
using gpu::testing::MemfdArena;

namespace {

constexpr uint64_t kRecordBytes = 4096 + 24;  // not a multiple of 16: exercises odd sizes
constexpr uint64_t kRecords = 8;

StagerOptions BaseOptions(bool cuda, MemfdArena& arena, int depth) {
  StagerOptions o;
  o.depth = depth;
  o.max_batch_bytes = kRecordBytes * kRecords;
  o.record_bytes = kRecordBytes;
  o.device.select = cuda ? gpu::DeviceOptions::Select::kCuda : gpu::DeviceOptions::Select::kHost;
  o.arena = arena.data();
  o.arena_bytes = arena.bytes();
  return o;
}

std::vector<uint8_t> TensorBytes(const DeviceBatch& b, size_t i, const gpu::Device& dev) {
  return gpu::testing::ToHost(dev, b.tensor(i).data, b.tensor(i).bytes(), &b.ready());
}

void StagesByteExact(bool cuda) {
  for (int depth = 1; depth <= 4; ++depth) {
    for (bool bounce : {false, true}) {
      DYNAMIC_SECTION("depth " << depth << (bounce ? " through the bounce pool" : " from the registered arena")) {
        MemfdArena arena(6 * kRecordBytes * kRecords);
        FakeArenaLoader loader(arena, 6, kRecordBytes, kRecords, 23);
        StagerOptions o = BaseOptions(cuda, arena, depth);
        o.force_bounce = bounce;
        auto stager = Stager::Create(o);
        REQUIRE(stager.ok());
        REQUIRE((*stager)->Start(loader.Source()).ok());
        size_t n = 0;
        for (;;) {
          auto next = (*stager)->Next();
          REQUIRE(next.ok());
          if (!next->has_value()) break;
          DeviceBatch& b = **next;
          REQUIRE(b.num_tensors() == 1);
          CHECK(b.tensor(0).shape == std::vector<int64_t>{kRecords, kRecordBytes});
          CHECK(b.sample_ids().front() == static_cast<int64_t>(n * kRecords));
          REQUIRE(TensorBytes(b, 0, (*stager)->device()) == loader.Expected(n));
          ++n;
        }
        CHECK(n == 23);
        auto stats = (*stager)->Stats();
        CHECK(stats.batches_staged == 23);
        CHECK(stats.bytes_staged == 23 * kRecordBytes * kRecords);
        CHECK(stats.arena_registered == !bounce);
        CHECK(stats.bytes_bounced == (bounce ? stats.bytes_staged : 0));
        stager->reset();
        // Every host slot came back exactly once, in order, on one thread that is not ours.
        auto order = loader.release_order();
        REQUIRE(order.size() == 23);
        for (size_t i = 0; i < order.size(); ++i) CHECK(order[i] == i);
        auto threads = loader.release_threads();
        for (auto t : threads) {
          CHECK(t != std::this_thread::get_id());
          CHECK(t == threads.front());
        }
      }
    }
  }
}

void RunsAtMostDepthAhead(bool cuda) {
  for (int depth : {1, 2, 4}) {
    DYNAMIC_SECTION("depth " << depth) {
      MemfdArena arena(8 * kRecordBytes * kRecords);
      FakeArenaLoader loader(arena, 8, kRecordBytes, kRecords, 20);
      auto stager = Stager::Create(BaseOptions(cuda, arena, depth));
      REQUIRE(stager.ok());
      REQUIRE((*stager)->Start(loader.Source()).ok());
      // Wait until the worker has filled every device slot, then a little longer.
      for (int i = 0; i < 200 && loader.handed_out() < static_cast<size_t>(depth); ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      CHECK(loader.handed_out() == static_cast<size_t>(depth));
      // Holding the first batch keeps its slot: the others cycle through the rest, and the
      // held batch's bytes stay intact however many follow.
      auto first = (*stager)->Next();
      REQUIRE(first.ok());
      REQUIRE(first->has_value());
      if (depth > 1) {
        for (size_t k = 1; k < 9; ++k) {
          auto b = (*stager)->Next();
          REQUIRE(b.ok());
          REQUIRE(b->has_value());
          REQUIRE(TensorBytes(**b, 0, (*stager)->device()) == loader.Expected(k));
        }
        CHECK(TensorBytes(**first, 0, (*stager)->device()) == loader.Expected(0));
      } else {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        CHECK(loader.handed_out() == 1);  // the only slot is held
      }
    }
  }
}

void ConvertsWhileStaging(bool cuda) {
  // Token rows of 513 uint16 → (input, target) int64 pairs of 512.
  const uint64_t rb = 513 * 2, records = 16;
  MemfdArena arena(4 * rb * records);
  FakeArenaLoader loader(arena, 4, rb, records, 9);
  StagerOptions o;
  o.depth = 2;
  o.max_batch_bytes = rb * records;
  o.record_bytes = rb;
  o.device.select = cuda ? gpu::DeviceOptions::Select::kCuda : gpu::DeviceOptions::Select::kHost;
  o.arena = arena.data();
  o.arena_bytes = arena.bytes();
  o.conversion.kind = gpu::ConversionSpec::Kind::kTokens;
  o.conversion.shift = true;
  auto stager = Stager::Create(o);
  REQUIRE(stager.ok());
  REQUIRE((*stager)->Start(loader.Source()).ok());
  for (size_t n = 0; n < 9; ++n) {
    auto b = (*stager)->Next();
    REQUIRE(b.ok());
    REQUIRE(b->has_value());
    REQUIRE((*b)->num_tensors() == 2);
    CHECK((*b)->tensor(1).shape == std::vector<int64_t>{16, 512});
    auto raw = loader.Expected(n);
    std::vector<int64_t> in(records * 512), tgt(records * 512);
    gpu::TokensToInt64Reference(raw.data(), gpu::DType::kUInt16, records, 513, true, in.data(), tgt.data());
    auto got_in = TensorBytes(**b, 0, (*stager)->device());
    auto got_tgt = TensorBytes(**b, 1, (*stager)->device());
    REQUIRE(std::memcmp(got_in.data(), in.data(), got_in.size()) == 0);
    REQUIRE(std::memcmp(got_tgt.data(), tgt.data(), got_tgt.size()) == 0);
  }
  auto end = (*stager)->Next();
  REQUIRE(end.ok());
  CHECK_FALSE(end->has_value());
}

void ExportsDLPack(bool cuda) {
  MemfdArena arena(4 * kRecordBytes * kRecords);
  FakeArenaLoader loader(arena, 4, kRecordBytes, kRecords, 3);
  auto stager = Stager::Create(BaseOptions(cuda, arena, 1));
  REQUIRE(stager.ok());
  REQUIRE((*stager)->Start(loader.Source()).ok());
  auto b = (*stager)->Next();
  REQUIRE(b.ok());
  REQUIRE(b->has_value());
  const void* data = (**b).tensor(0).data;
  // Stream 1 (the legacy default stream), as torch passes for __dlpack__(stream=None).
  auto t = (**b).ExportDLPack(0, 1);
  REQUIRE(t.ok());
  DLManagedTensor* m = *t;
  CHECK(m->dl_tensor.data == data);
  CHECK(m->dl_tensor.device.device_type == (cuda ? kDLCUDA : kDLCPU));
  CHECK(m->dl_tensor.ndim == 2);
  CHECK(m->dl_tensor.shape[0] == static_cast<int64_t>(kRecords));
  CHECK(m->dl_tensor.shape[1] == static_cast<int64_t>(kRecordBytes));
  CHECK(m->dl_tensor.dtype.code == kDLUInt);
  CHECK(m->dl_tensor.dtype.bits == 8);
  CHECK(m->dl_tensor.strides == nullptr);
  CHECK((**b).ExportDLPack(1, -1).status().code() == StatusCode::kOutOfRange);
  // Dropping the batch keeps the slot while the export lives (depth 1: nothing else stages).
  b->reset();
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  CHECK(loader.handed_out() == 1);
  REQUIRE(gpu::testing::ToHost((*stager)->device(), m->dl_tensor.data, kRecordBytes * kRecords) ==
          loader.Expected(0));
  m->deleter(m);
  auto b2 = (*stager)->Next();
  REQUIRE(b2.ok());
  REQUIRE(b2->has_value());
  CHECK(loader.handed_out() >= 2);
}

}  // namespace

TEST_CASE("the stager delivers every batch byte-exact at depth 1..4, registered or bounced", "[cuda][stager]") {
  StagesByteExact(false);
}
TEST_CASE("the stager delivers every batch byte-exact on a GPU", "[cuda][stager][gpu]") { StagesByteExact(true); }

TEST_CASE("the stager runs at most depth batches ahead and never reuses a held slot", "[cuda][stager]") {
  RunsAtMostDepthAhead(false);
}
TEST_CASE("the stager runs at most depth batches ahead on a GPU", "[cuda][stager][gpu]") {
  RunsAtMostDepthAhead(true);
}

TEST_CASE("the stager runs the loader's conversion after the copy", "[cuda][stager]") { ConvertsWhileStaging(false); }
TEST_CASE("the stager runs the conversion kernels after the copy on a GPU", "[cuda][stager][gpu]") {
  ConvertsWhileStaging(true);
}

TEST_CASE("a DLPack export holds the batch's buffer until its deleter runs", "[cuda][stager][dlpack]") {
  ExportsDLPack(false);
}
TEST_CASE("a DLPack export is a CUDA tensor ordered after the copy", "[cuda][stager][dlpack][gpu]") {
  ExportsDLPack(true);
}

TEST_CASE("a batch outside the registered arena goes through the bounce pool", "[cuda][stager]") {
  MemfdArena arena(kRecordBytes * kRecords);
  std::vector<uint8_t> outside = gpu::testing::RandomBytes(kRecordBytes * kRecords, 5);
  auto stager = Stager::Create(BaseOptions(false, arena, 2));
  REQUIRE(stager.ok());
  int calls = 0, released = 0;
  REQUIRE((*stager)
              ->Start([&]() -> Result<std::optional<HostBatch>> {
                if (calls++ > 0) return std::optional<HostBatch>();
                HostBatch hb;
                hb.data = outside.data();
                hb.bytes = outside.size();
                hb.records = kRecords;
                hb.record_bytes = kRecordBytes;
                hb.release = [&] { ++released; };
                return std::optional<HostBatch>(std::move(hb));
              })
              .ok());
  auto b = (*stager)->Next();
  REQUIRE(b.ok());
  REQUIRE(b->has_value());
  CHECK(TensorBytes(**b, 0, (*stager)->device()) == outside);
  CHECK((*stager)->Stats().bytes_bounced == outside.size());
  b->reset();
  stager->reset();
  CHECK(released == 1);
}

TEST_CASE("stager errors name the problem and still give host slots back", "[cuda][stager]") {
  MemfdArena arena(4 * kRecordBytes * kRecords);
  auto opts = BaseOptions(false, arena, 2);

  SECTION("options") {
    auto o = opts;
    o.depth = 0;
    CHECK_THAT(Stager::Create(o).status().message(), Catch::Contains("depth"));
    o = opts;
    o.max_batch_bytes = 0;
    CHECK_THAT(Stager::Create(o).status().message(), Catch::Contains("max_batch_bytes"));
    o = opts;
    o.conversion.kind = gpu::ConversionSpec::Kind::kTokens;
    o.record_bytes = 3;
    CHECK(Stager::Create(o).status().code() == StatusCode::kInvalidArgument);
  }
  SECTION("Next without Start") {
    auto s = Stager::Create(opts);
    REQUIRE(s.ok());
    CHECK((*s)->Next().status().code() == StatusCode::kFailedPrecondition);
  }
  SECTION("an oversized batch") {
    auto s = Stager::Create(opts);
    REQUIRE(s.ok());
    int released = 0;
    std::vector<uint8_t> big(opts.max_batch_bytes + kRecordBytes);
    REQUIRE((*s)->Start([&]() -> Result<std::optional<HostBatch>> {
                 HostBatch hb;
                 hb.data = big.data();
                 hb.bytes = big.size();
                 hb.records = kRecords + 1;
                 hb.record_bytes = kRecordBytes;
                 hb.release = [&] { ++released; };
                 return std::optional<HostBatch>(std::move(hb));
               })
                .ok());
    CHECK((*s)->Start(nullptr).code() == StatusCode::kFailedPrecondition);  // epoch still running
    auto n = (*s)->Next();
    REQUIRE_FALSE(n.ok());
    CHECK_THAT(n.status().message(), Catch::Contains("exceeds max_batch_bytes"));
    s->reset();
    CHECK(released == 1);
  }
  SECTION("a failing source") {
    auto s = Stager::Create(opts);
    REQUIRE(s.ok());
    REQUIRE((*s)->Start([]() -> Result<std::optional<HostBatch>> { return Unavailable("daemon went away"); }).ok());
    auto n = (*s)->Next();
    CHECK(n.status().code() == StatusCode::kUnavailable);
    CHECK_THAT(n.status().message(), Catch::Contains("daemon went away"));
  }
}

TEST_CASE("stopping the stager mid-epoch gives every host slot back once", "[cuda][stager]") {
  MemfdArena arena(6 * kRecordBytes * kRecords);
  FakeArenaLoader loader(arena, 6, kRecordBytes, kRecords, 50);
  {
    auto stager = Stager::Create(BaseOptions(false, arena, 3));
    REQUIRE(stager.ok());
    REQUIRE((*stager)->Start(loader.Source()).ok());
    auto b = (*stager)->Next();
    REQUIRE(b.ok());
    REQUIRE(b->has_value());
    // The batch outlives the stager: its buffer stays valid until it is dropped.
    auto keep = std::move(**b);
    stager->reset();
    CHECK(TensorBytes(keep, 0, gpu::Device::Host()) == loader.Expected(0));
  }
  CHECK(loader.release_order().size() == loader.handed_out());
  CHECK(loader.handed_out() <= 3);
}

namespace {
// The shape of libshardcache's Loader/Batch, for SourceFromLoader.
struct FakeBatch {
  std::vector<uint8_t> bytes;
  std::vector<uint64_t> ids;
  int* released;
  struct View {
    const uint8_t* data;
    size_t size;
  };
  size_t size() const { return ids.size(); }
  const std::vector<uint64_t>& sample_ids() const { return ids; }
  View sample(size_t i) const { return {bytes.data() + 10 * i, 10}; }
  const uint8_t* data() const { return bytes.data(); }
  uint64_t payload_bytes() const { return bytes.size(); }
  uint64_t record_bytes() const { return 0; }
  Status Release() {
    ++*released;
    return Status::Ok();
  }
};
struct FakeLoader {
  int left = 2;
  int released = 0;
  Result<FakeBatch> Next() {
    if (left-- <= 0) return OutOfRange("end of epoch");
    return FakeBatch{std::vector<uint8_t>(30, static_cast<uint8_t>(left)), {7, 8, 9}, &released};
  }
};
}  // namespace

TEST_CASE("a libshardcache loader feeds the stager through SourceFromLoader", "[cuda][stager]") {
  FakeLoader loader;
  StagerOptions o;
  o.max_batch_bytes = 64;
  o.device.select = gpu::DeviceOptions::Select::kHost;
  auto stager = Stager::Create(o);
  REQUIRE(stager.ok());
  REQUIRE((*stager)->Start(SourceFromLoader(loader)).ok());
  int n = 0;
  for (;;) {
    auto b = (*stager)->Next();
    REQUIRE(b.ok());
    if (!b->has_value()) break;
    CHECK((*b)->sample_ids() == std::vector<int64_t>{7, 8, 9});
    CHECK((*b)->sample_offsets() == std::vector<uint64_t>{0, 10, 20});
    CHECK((*b)->tensor(0).shape == std::vector<int64_t>{30});
    ++n;
  }
  CHECK(n == 2);
  stager->reset();
  CHECK(loader.released == 2);
}
