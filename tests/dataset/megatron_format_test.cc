#include "dataset/megatron_format.h"

#include <catch2/catch.hpp>

#include <cstring>

#include "common/fs.h"
#include "testing/process.h"
#include "testing/temp_dir.h"

namespace shardcache::dataset {
namespace {

using shardcache::testing::RunCommand;
using shardcache::testing::TempDir;

template <typename T>
void Poke(std::string& s, size_t at, T v) {
  std::memcpy(&s[at], &v, sizeof v);
}

TEST_CASE("a Megatron index yields one sample per sequence", "[dataset][megatron]") {
  const std::string idx = MakeMegatronIndex({5, 0, 7}, /*uint16*/ 8);
  auto r = ParseMegatronIndex(idx, "p.idx", 24, "p.bin");
  REQUIRE(r.ok());
  CHECK(r->dtype_bytes == 2);
  CHECK(r->document_count == 4);
  REQUIRE(r->samples.offsets_size() == 3);
  CHECK(r->samples.offsets(0) == 0);
  CHECK(r->samples.lengths(0) == 10);
  CHECK(r->samples.offsets(2) == 10);
  CHECK(r->samples.lengths(2) == 14);
}

TEST_CASE("an index written the way Megatron-LM's _IndexWriter writes it parses",
          "[dataset][megatron][integration]") {
  TempDir tmp;
  // Independent writer: struct/numpy calls as in megatron/core/datasets/indexed_dataset.py,
  // int32 tokens (dtype code 4), documents of 2 and 1 sequences, multimodal mode bytes.
  const std::string script = R"(
import struct, sys, numpy
lengths = [3, 4, 2]
pointers = [0, 12, 28]
docs = [0, 2, 3]
with open(sys.argv[1], 'wb') as f:
    f.write(b'MMIDIDX\x00\x00')
    f.write(struct.pack('<Q', 1))
    f.write(struct.pack('<B', 4))
    f.write(struct.pack('<Q', len(lengths)))
    f.write(struct.pack('<Q', len(docs)))
    f.write(numpy.array(lengths, dtype=numpy.int32).tobytes(order='C'))
    f.write(numpy.array(pointers, dtype=numpy.int64).tobytes(order='C'))
    f.write(numpy.array(docs, dtype=numpy.int64).tobytes(order='C'))
    f.write(numpy.array([0, 1, 0], dtype=numpy.int8).tobytes(order='C'))
)";
  {
    FILE* f = std::fopen((tmp / "w.py").c_str(), "w");
    std::fputs(script.c_str(), f);
    std::fclose(f);
  }
  std::string out;
  REQUIRE(RunCommand("/usr/bin/python3 " + (tmp / "w.py") + " " + (tmp / "m.idx"), &out) == 0);
  auto bytes = ReadFileToString(tmp / "m.idx");
  REQUIRE(bytes.ok());
  auto r = ParseMegatronIndex(*bytes, "m.idx", 36, "m.bin");
  REQUIRE(r.ok());
  CHECK(r->dtype_bytes == 4);
  CHECK(r->document_count == 3);
  REQUIRE(r->samples.offsets_size() == 3);
  CHECK(r->samples.offsets(1) == 12);
  CHECK(r->samples.lengths(1) == 16);
  CHECK(r->samples.offsets(2) == 28);
  CHECK(r->samples.lengths(2) == 8);
}

TEST_CASE("an .idx that does not match its .bin is DataLoss naming file and offset",
          "[dataset][megatron]") {
  const std::string good = MakeMegatronIndex({5, 6, 7}, 8);  // .bin of 36 bytes
  REQUIRE(ParseMegatronIndex(good, "p.idx", 36, "p.bin").ok());

  auto expect = [](Result<MegatronIndex> r, const std::string& a, const std::string& b) {
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == StatusCode::kDataLoss);
    CHECK_THAT(r.status().message(), Catch::Contains(a) && Catch::Contains(b));
  };
  SECTION("the .bin is shorter than the last sequence") {
    expect(ParseMegatronIndex(good, "p.idx", 35, "p.bin"), "p.idx at offset 62",
           "beyond the end of p.bin (35 bytes)");
  }
  SECTION("bad magic") {
    std::string bad = good;
    bad[0] = 'X';
    expect(ParseMegatronIndex(bad, "p.idx", 36, "p.bin"), "p.idx at offset 0", "magic");
  }
  SECTION("unsupported version") {
    std::string bad = good;
    Poke<uint64_t>(bad, 9, 2);
    expect(ParseMegatronIndex(bad, "p.idx", 36, "p.bin"), "offset 9", "version 2");
  }
  SECTION("unknown dtype") {
    std::string bad = good;
    bad[17] = 42;
    expect(ParseMegatronIndex(bad, "p.idx", 36, "p.bin"), "offset 17", "dtype code 42");
  }
  SECTION("truncated header") {
    expect(ParseMegatronIndex(good.substr(0, 20), "p.idx", 36, "p.bin"), "p.idx",
           "truncated Megatron index header");
  }
  SECTION("truncated arrays") {
    expect(ParseMegatronIndex(good.substr(0, good.size() - 9), "p.idx", 36, "p.bin"),
           "offset 18", "truncated .idx");
  }
  SECTION("a huge sequence count is refused before anything is allocated") {
    std::string bad = good;
    Poke<uint64_t>(bad, 18, ~0ull / 2);
    expect(ParseMegatronIndex(bad, "p.idx", 36, "p.bin"), "offset 18", "sequences");
  }
  SECTION("a negative size") {
    std::string bad = good;
    Poke<int32_t>(bad, 34 + 4, -1);
    expect(ParseMegatronIndex(bad, "p.idx", 36, "p.bin"), "offset 38", "negative size");
  }
  SECTION("a pointer past the .bin") {
    std::string bad = good;
    Poke<int64_t>(bad, 34 + 12, 1 << 20);
    expect(ParseMegatronIndex(bad, "p.idx", 36, "p.bin"), "offset 46", "does not match its .bin");
  }
  SECTION("document index not ending at the sequence count") {
    std::string bad = good;
    Poke<int64_t>(bad, good.size() - 8, 2);
    expect(ParseMegatronIndex(bad, "p.idx", 36, "p.bin"), "sequence count", "last document");
  }
  SECTION("trailing garbage") {
    expect(ParseMegatronIndex(good + "xy", "p.idx", 36, "p.bin"), "offset", "trailing bytes");
  }
}

}  // namespace
}  // namespace shardcache::dataset
