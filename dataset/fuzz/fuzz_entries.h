// Parser entry points shared by the libFuzzer targets (dataset/fuzz/fuzz_*.cc, built with
// -DSHARDCACHE_FUZZ=ON and clang) and the corpus regression test (tests/fuzz), so `make test`
// runs every committed corpus file through exactly the code the fuzzers exercise.
//
// Each returns the parser's Status (never crashes, whatever the bytes); callers that only look
// for crashes ignore it.
// Thread safety: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/status.h"

namespace shardcache::dataset::fuzz {

// Input: a whole tar shard.
Status FuzzTar(const uint8_t* data, size_t size);
// Input: a whole Megatron .idx; the .bin is taken to be kFuzzBinBytes long.
constexpr uint64_t kFuzzBinBytes = 1 << 16;
Status FuzzMegatronIdx(const uint8_t* data, size_t size);
// Input: 4-byte little-endian manifest length N, N manifest bytes, then the bytes of shard 0's
// sample index. Parses the manifest, walks its chunk math, then parses the sample index.
Status FuzzManifest(const uint8_t* data, size_t size);

}  // namespace shardcache::dataset::fuzz
