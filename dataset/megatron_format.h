// The `megatron` shard format: a Megatron-LM (megatron/core/datasets/indexed_dataset.py)
// indexed dataset, a token file `<prefix>.bin` plus its index `<prefix>.idx`. One sample per
// sequence: offset = the sequence's byte pointer into .bin, length = element count × dtype size.
//
// .idx layout (all integers little-endian):
//   0  magic     9 bytes "MMIDIDX\0\0"
//   9  version   uint64, must be 1
//   17 dtype     uint8 code: 1 uint8, 2 int8, 3 int16, 4 int32, 5 int64, 6 float64,
//                7 float32, 8 uint16
//   18 N         uint64 sequence count
//   26 M         uint64 document count
//   34 sizes     int32[N]   elements per sequence
//      pointers  int64[N]   byte offset of each sequence in .bin
//      doc_idx   int64[M]   sequence index range boundaries per document
//      modes     int8[N]    optional (multimodal datasets)
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "shardcache/manifest.pb.h"

namespace shardcache::dataset {

constexpr char kMegatronMagic[] = "MMIDIDX\0\0";  // 9 bytes incl. the two NULs
constexpr uint64_t kMegatronMagicBytes = 9;
constexpr uint64_t kMegatronHeaderBytes = 34;

// Bytes per element for a dtype code; 0 for an unknown code.
uint32_t MegatronDtypeBytes(uint8_t code);
// numpy's name of a dtype code ("uint16", "int32", ...); "" for an unknown code.
const char* MegatronDtypeName(uint8_t code);
// The tokens' dtype name of a megatron manifest. Manifests written before the dtype code was
// recorded have only its size: 1, 2, 4 and 8 bytes read as uint8, uint16, int32 and int64, what
// Megatron's builder picks for a vocabulary of that size.
const char* MegatronTokenDtype(const v1::Manifest& m);

struct MegatronIndex {
  v1::SampleIndex samples;
  uint8_t dtype_code = 0;
  uint32_t dtype_bytes = 0;
  uint64_t document_count = 0;
};

// Parses .idx bytes and checks them against a .bin of `bin_bytes`. DataLoss naming `idx_name`
// (or `bin_name`) and the offending offset on bad magic, unsupported version or dtype,
// truncation, negative sizes, or a sequence lying beyond the .bin.
Result<MegatronIndex> ParseMegatronIndex(std::string_view idx_bytes, const std::string& idx_name,
                                         uint64_t bin_bytes, const std::string& bin_name);

// Serializes an .idx for sequences of the given element counts laid out back to back in the
// .bin, one document per sequence (as Megatron's builder writes them). For tests and datagen.
std::string MakeMegatronIndex(const std::vector<int32_t>& sequence_lengths, uint8_t dtype_code);

}  // namespace shardcache::dataset
