#include <catch2/catch.hpp>

#include <algorithm>
#include <thread>

#include "common/fs.h"
#include "common/hash.h"
#include "common/metrics.h"
#include "common/stats.h"
#include "common/thread_name.h"
#include "common/units.h"
#include "testing/temp_dir.h"

using namespace shardcache;

TEST_CASE("sizes parse with binary and decimal units") {
  CHECK(*ParseBytes("4096") == 4096);
  CHECK(*ParseBytes("4MiB") == 4ull << 20);
  CHECK(*ParseBytes("800GiB") == 800ull << 30);
  CHECK(*ParseBytes("1.5GiB") == 3ull << 29);
  CHECK(*ParseBytes("2 KB") == 2000);
  CHECK(*ParseBytes("0") == 0);
}

TEST_CASE("bad sizes are refused with the text named") {
  auto r = ParseBytes("12 parsecs");
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().code() == StatusCode::kInvalidArgument);
  CHECK(r.status().message().find("12 parsecs") != std::string::npos);
  CHECK_FALSE(ParseBytes("").ok());
  CHECK_FALSE(ParseBytes("-5MiB").ok());
  CHECK_FALSE(ParseBytes("1.5").ok());
  CHECK_FALSE(ParseBytes("99999999999TiB").ok());
}

TEST_CASE("rates parse in bits and bytes per second") {
  CHECK(*ParseRate("0") == 0);
  CHECK(*ParseRate("1000Mbit") == 125000000);
  CHECK(*ParseRate("1Gbit") == 125000000);
  CHECK(*ParseRate("100MiB/s") == 100ull << 20);
  CHECK_FALSE(ParseRate("fast").ok());
}

TEST_CASE("xxh3-128 hashes round-trip through bytes and hex") {
  const Hash128 h = HashBytes("hello shardcache");
  CHECK(Hash128::FromBytes(h.ToBytes()) == h);
  CHECK(h.ToHex().size() == 32);
  CHECK(HashBytes("hello shardcachf") != h);
  StreamingHasher s;
  s.Update("hello ", 6);
  s.Update("shardcache", 10);
  CHECK(s.Digest() == h);
}

TEST_CASE("a chunk digest is the Merkle root of its 16 KiB block table; each block checks alone") {
  std::string chunk(3 * kChunkBlockBytes + 100, '\0');  // 3 full blocks and a short one
  for (size_t i = 0; i < chunk.size(); ++i) chunk[i] = static_cast<char>(i * 131 + (i >> 9));
  const std::string table = BlockTable(chunk.data(), chunk.size());
  REQUIRE(ChunkBlockCount(chunk.size()) == 4);
  REQUIRE(table.size() == 4 * kBlockHashBytes);
  CHECK(ChunkDigest(chunk.data(), chunk.size()) == RootOfBlockTable(table));
  CHECK(ChunkDigest(chunk.data(), chunk.size()) != HashBytes(chunk));  // not the flat hash
  for (size_t b = 0; b < 4; ++b) {
    const size_t off = b * kChunkBlockBytes, n = std::min(kChunkBlockBytes, chunk.size() - off);
    CHECK(BlockTableEntry(table, b) == HashBytes(chunk.data() + off, n));
  }
  SECTION("one changed byte changes its block's entry only, and the root") {
    std::string bad = chunk;
    bad[2 * kChunkBlockBytes + 7] ^= 1;
    const std::string bad_table = BlockTable(bad.data(), bad.size());
    CHECK(BlockTableEntry(bad_table, 2) != BlockTableEntry(table, 2));
    CHECK(BlockTableEntry(bad_table, 1) == BlockTableEntry(table, 1));
    CHECK(BlockTableEntry(bad_table, 3) == BlockTableEntry(table, 3));
    CHECK(ChunkDigest(bad.data(), bad.size()) != ChunkDigest(chunk.data(), chunk.size()));
  }
  SECTION("an empty chunk has no blocks") {
    CHECK(ChunkBlockCount(0) == 0);
    CHECK(BlockTable(chunk.data(), 0).empty());
  }
}

TEST_CASE("files are written atomically and read back") {
  testing::TempDir dir;
  const std::string p = dir / "f";
  REQUIRE(WriteFileAtomic(p, "abc").ok());
  REQUIRE(WriteFileAtomic(p, "defg").ok());
  CHECK(*ReadFileToString(p) == "defg");
  auto missing = ReadFileToString(dir / "nope");
  REQUIRE_FALSE(missing.ok());
  CHECK(missing.status().code() == StatusCode::kNotFound);
  CHECK(missing.status().message().find("nope") != std::string::npos);
}

TEST_CASE("errno maps to retryable and fatal codes") {
  CHECK(ErrnoStatus(ENOSPC, "w").code() == StatusCode::kResourceExhausted);
  CHECK(ErrnoStatus(ENOENT, "w").code() == StatusCode::kNotFound);
  CHECK(ErrnoStatus(ECONNRESET, "w").IsRetryable());
  CHECK_FALSE(ErrnoStatus(EINVAL, "w").IsRetryable());
}

TEST_CASE("metrics render in Prometheus text format") {
  metrics::Registry r;
  r.GetCounter("sc_test_bytes_total", "bytes", {{"tier", "nvme"}})->Add(5);
  r.GetGauge("sc_test_used", "used")->Set(2.5);
  auto* h = r.GetHistogram("sc_test_latency_seconds", "lat", {0.1, 1});
  h->Observe(0.05);
  h->Observe(0.5);
  h->Observe(5);
  const std::string text = r.RenderPrometheus();
  CHECK(text.find("sc_test_bytes_total{tier=\"nvme\"} 5") != std::string::npos);
  CHECK(text.find("sc_test_used 2.5") != std::string::npos);
  CHECK(text.find("sc_test_latency_seconds_bucket{le=\"1\"} 2") != std::string::npos);
  CHECK(text.find("sc_test_latency_seconds_bucket{le=\"+Inf\"} 3") != std::string::npos);
  CHECK(text.find("sc_test_latency_seconds_count 3") != std::string::npos);
  CHECK(r.ValueOf("sc_test_bytes_total", {{"tier", "nvme"}}) == 5);
  CHECK(r.ValueOf("absent") == -1);
}

TEST_CASE("a scaled counter adds integers and is exposed in its base unit") {
  metrics::Registry r;
  auto* stall = r.GetScaledCounter("sc_test_stall_seconds_total", "stall", 1e-6);
  stall->Add(1500000);
  auto* cpu = r.GetScaledCounter("sc_test_cpu_seconds_total", "cpu", 0.01);
  cpu->Advance(250);
  cpu->Advance(100);  // a lower total never lowers a counter
  const std::string text = r.RenderPrometheus();
  CHECK(text.find("sc_test_stall_seconds_total 1.5\n") != std::string::npos);
  CHECK(text.find("sc_test_cpu_seconds_total 2.5\n") != std::string::npos);
  CHECK(r.ValueOf("sc_test_stall_seconds_total") == 1.5);
  CHECK_THROWS(r.GetCounter("sc_test_stall_seconds_total", "stall"));
}

TEST_CASE("the mount point of a path comes from /proc/self/mountinfo") {
  auto proc = MountPointOf("/proc/self/fd");  // a symlink into /proc, resolved first
  REQUIRE(proc.ok());
  CHECK(*proc == "/proc");
  auto root = MountPointOf("/");
  REQUIRE(root.ok());
  CHECK(*root == "/");
  auto missing = MountPointOf("/nonexistent/dir");
  REQUIRE_FALSE(missing.ok());
  CHECK(missing.status().message().find("/nonexistent/dir") != std::string::npos);
}

namespace {

// A component that keeps its own counts and reports them through stats::Source.
struct FakeComponent final : stats::Source {
  uint64_t reads = 0;
  double used = 0;
  void VisitStats(const stats::Visitor& visit) const override {
    static const stats::Labels kDram{{"tier", "dram"}};
    stats::Counter(visit, {"sc_test_reads_total", "Reads"}, reads, &kDram);
    stats::Gauge(visit, {"sc_test_used_bytes", "Used"}, used);
  }
};

}  // namespace

TEST_CASE("a stats source's figures render once: the same values in /metrics and ValueOf, one family each") {
  metrics::Registry r;
  FakeComponent a, b;
  a.reads = 3;
  a.used = 10;
  auto ha = r.AddSource(&a);
  CHECK(r.RenderPrometheus().find("sc_test_reads_total{tier=\"dram\"} 3\n") != std::string::npos);
  {
    auto hb = r.AddSource(&b);
    b.reads = 4;
    b.used = 5;
    const std::string text = r.RenderPrometheus();
    // Two live instances add up in one series, under one HELP/TYPE.
    CHECK(text.find("# HELP sc_test_reads_total Reads\n# TYPE sc_test_reads_total counter\n"
                    "sc_test_reads_total{tier=\"dram\"} 7\n") != std::string::npos);
    CHECK(text.find("sc_test_used_bytes 15\n") != std::string::npos);
    CHECK(text.find("# TYPE sc_test_reads_total") == text.rfind("# TYPE sc_test_reads_total"));
    CHECK(r.ValueOf("sc_test_reads_total", {{"tier", "dram"}}) == 7);
  }
  // b left: its count stays in the counter (never goes down), its gauge leaves.
  a.reads = 5;
  CHECK(r.ValueOf("sc_test_reads_total", {{"tier", "dram"}}) == 9);
  CHECK(r.ValueOf("sc_test_used_bytes") == 10);
  ha.Reset();
  CHECK(r.ValueOf("sc_test_reads_total", {{"tier", "dram"}}) == 9);
  CHECK(r.ValueOf("sc_test_used_bytes") == 0);
}

TEST_CASE("a stats source's family exists at zero from the moment it is added") {
  metrics::Registry r;
  FakeComponent a;
  auto h = r.AddSource(&a);
  const std::string text = r.RenderPrometheus();
  CHECK(text.find("sc_test_reads_total{tier=\"dram\"} 0\n") != std::string::npos);
  CHECK(text.find("sc_test_used_bytes 0\n") != std::string::npos);
}

TEST_CASE("a thread names itself; a name past the kernel's 15 bytes is cut, not refused") {
  std::string short_name, long_name;
  std::thread([&] {
    NameThisThread("sc-test");
    short_name = ThisThreadName();
    NameThisThread("sc-a-name-much-longer-than-fifteen");
    long_name = ThisThreadName();
  }).join();
  CHECK(short_name == "sc-test");
  CHECK(long_name == "sc-a-name-much-");
  CHECK(long_name.size() == kMaxThreadNameBytes);
}
