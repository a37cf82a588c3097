// Runs every committed fuzz corpus file (tests/fuzz/corpus/<parser>/) through the same entry
// points the libFuzzer targets use, without libFuzzer, so `make test` keeps the corpora — seeds,
// damaged inputs and past crashers — passing on the default compiler.
// Naming: ok-* must parse, bad-* must be rejected, anything else (crash-*, any-*) must only not
// crash. Internal is never acceptable: it means a parser accepted input and reported ranges
// outside it.
#include <catch2/catch.hpp>

#include <filesystem>
#include <string>

#include "common/fs.h"
#include "daemon/fuzz/fuzz_entries.h"
#include "dataset/fuzz/fuzz_entries.h"

namespace shardcache::dataset::fuzz {
namespace {

using Entry = Status (*)(const uint8_t*, size_t);

void RunCorpus(const std::string& parser, Entry entry) {
  const std::string dir = std::string(SC_SOURCE_DIR) + "/tests/fuzz/corpus/" + parser;
  int files = 0, ok = 0, bad = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    if (!e.is_regular_file()) continue;
    const std::string name = e.path().filename().string();
    auto bytes = ReadFileToString(e.path().string());
    REQUIRE(bytes.ok());
    const Status s = entry(reinterpret_cast<const uint8_t*>(bytes->data()), bytes->size());
    INFO(parser << "/" << name << ": " << s.ToString());
    CHECK(s.code() != StatusCode::kInternal);
    if (name.rfind("ok-", 0) == 0) {
      CHECK(s.ok());
      ++ok;
    } else if (name.rfind("bad-", 0) == 0) {
      CHECK_FALSE(s.ok());
      ++bad;
    }
    ++files;
  }
  // A corpus that vanished would make this test pass vacuously.
  CHECK(ok >= 2);
  CHECK(bad >= 2);
  CHECK(files >= 5);
}

TEST_CASE("the tar fuzz corpus parses without crashing", "[fuzz][tar]") {
  RunCorpus("tar", &FuzzTar);
}

TEST_CASE("the megatron .idx fuzz corpus parses without crashing", "[fuzz][megatron]") {
  RunCorpus("megatron_idx", &FuzzMegatronIdx);
}

TEST_CASE("the manifest and sample index fuzz corpus parses without crashing",
          "[fuzz][manifest]") {
  RunCorpus("manifest", &FuzzManifest);
}

TEST_CASE("the local protocol fuzz corpus is checked and planned without crashing or hanging",
          "[fuzz][local]") {
  RunCorpus("local_request", &daemon::fuzz::FuzzLocalRequest);
}

TEST_CASE("the Origin request fuzz corpus is checked without crashing", "[fuzz][origin]") {
  RunCorpus("origin_request", &daemon::fuzz::FuzzOriginRequest);
}

TEST_CASE("the config fuzz corpus parses without crashing", "[fuzz][config]") {
  RunCorpus("config", &daemon::fuzz::FuzzConfig);
}

TEST_CASE("the admin HTTP fuzz corpus is answered and the server survives", "[fuzz][admin]") {
  RunCorpus("admin_request", &daemon::fuzz::FuzzAdminRequest);
}

}  // namespace
}  // namespace shardcache::dataset::fuzz
