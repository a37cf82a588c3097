// Synthetic datasets: deterministic generated content for tests, the demo and benchmarks
// (tests/testing/datasets.h, sc_datagen). Every byte is a pure function of (seed, shard, item),
// so a reader can recompute what it should have received instead of trusting a copy.
//
//   random  — incompressible bytes (like JPEG or float noise)
//   tokens  — little-endian uint16 token ids with a Zipf(1)-like distribution over a 50k
//             vocabulary, compressible roughly like tokenized text
//
// Writers use large buffers (8 MiB) and no fsync: this is scratch data.
// Thread safety: pure functions; writers may run concurrently on different paths.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "common/status.h"

namespace shardcache::dataset::synthetic {

enum class RecordKind { kRandom, kTokens };

// Fills out[0, n) with record `record` of `shard`. kTokens needs an even n (a trailing odd
// byte is filled with random).
void FillRecord(RecordKind kind, uint64_t seed, uint64_t shard, uint64_t record, char* out,
                size_t n);
std::string RecordBytes(uint64_t seed, uint64_t shard, uint64_t record, uint64_t record_bytes);
std::string TokenRecordBytes(uint64_t seed, uint64_t shard, uint64_t record,
                             uint64_t tokens_per_record);

// Random bytes starting with a JPEG SOI marker, size drawn from [min_bytes, max_bytes].
std::string JpgLikeBytes(uint64_t seed, uint64_t shard, uint64_t item, uint64_t min_bytes,
                         uint64_t max_bytes);
// WebDataset key of a generated tar sample: "s00001-00000042".
std::string SampleKey(uint64_t shard, uint64_t sample);

// `records` shard: records_per_shard records of record_bytes.
Status WriteRecordsShard(const std::string& path, RecordKind kind, uint64_t seed, uint64_t shard,
                         uint64_t records, uint64_t record_bytes);
// WebDataset tar shard: per sample "<key>.jpg" (JpgLikeBytes) and "<key>.cls" (sample % 1000).
Status WriteTarShard(const std::string& path, uint64_t seed, uint64_t shard, uint64_t samples,
                     uint64_t min_bytes, uint64_t max_bytes);
// Megatron .bin + .idx: uint16 tokens, sequence lengths in [min_tokens, max_tokens], one
// document per sequence.
Status WriteMegatronShard(const std::string& bin_path, const std::string& idx_path,
                          uint64_t seed, uint64_t shard, uint64_t sequences, uint64_t min_tokens,
                          uint64_t max_tokens);
// A tree of `count` small files as an image-classification folder: out/train/class-NNN/
// img-NNNNNNNN.jpg (JpgLikeBytes) and img-NNNNNNNN.cls pairs, spread over `dirs` class folders.
// *bytes receives the total size written.
Status WriteFileTree(const std::string& out, uint64_t seed, uint64_t count, uint64_t min_bytes,
                     uint64_t max_bytes, uint64_t dirs, uint64_t* bytes);

}  // namespace shardcache::dataset::synthetic
