// Test datasets: small, deterministic datasets written and indexed in milliseconds, for every
// component's tests. Each writes root/name/<shards> and runs the real indexer on it, returning
// the loaded dataset (IndexDirectory's result).
//
// Content is a pure function of (seed, shard, item), so a test can recompute the bytes it
// expects (RecordBytes, TarJpgBytes) instead of reading them back.
//
// Thread safety: free functions; concurrent calls must use different directories.
#pragma once

#include <cstdint>
#include <string>

#include "common/status.h"
#include "dataset/manifest.h"
#include "dataset/synthetic.h"

namespace shardcache::testing {

// Records dataset: shards root/name/shard-00000.bin ...; record r of shard s is
// RecordBytes(seed, s, r, record_bytes) (incompressible pseudo-random bytes).
Result<dataset::DatasetPtr> MakeRecordsDataset(const std::string& root, const std::string& name,
                                               int shards, uint64_t records_per_shard,
                                               uint64_t record_bytes,
                                               uint64_t chunk_bytes = dataset::kDefaultChunkBytes,
                                               uint64_t seed = 1);
using dataset::synthetic::RecordBytes;

// Token dataset (records format): each record holds `tokens_per_record` little-endian uint16
// token ids drawn from a Zipf-like distribution over a 50k vocabulary, so it compresses
// (about 1.3-1.6x with zstd) like real tokenized text. Record bytes = 2 * tokens_per_record.
Result<dataset::DatasetPtr> MakeTokenDataset(const std::string& root, const std::string& name,
                                             int shards, uint64_t records_per_shard,
                                             uint64_t tokens_per_record,
                                             uint64_t chunk_bytes = dataset::kDefaultChunkBytes,
                                             uint64_t seed = 1);
using dataset::synthetic::TokenRecordBytes;

// WebDataset tar dataset: shards root/name/shard-00000.tar ...; sample k of shard s has key
// "s<shard>-<k>" (zero padded) and two members: "<key>.jpg" holding
// TarJpgBytes(seed, s, k, min_bytes, max_bytes) (random, size in [min_bytes, max_bytes]) and
// "<key>.cls" holding the decimal class (k % 1000).
Result<dataset::DatasetPtr> MakeTarDataset(const std::string& root, const std::string& name,
                                           int shards, uint64_t samples_per_shard,
                                           uint64_t min_bytes = 1000, uint64_t max_bytes = 20000,
                                           uint64_t chunk_bytes = dataset::kDefaultChunkBytes,
                                           uint64_t seed = 1);
inline std::string TarJpgBytes(uint64_t seed, uint64_t shard, uint64_t sample,
                               uint64_t min_bytes, uint64_t max_bytes) {
  return dataset::synthetic::JpgLikeBytes(seed, shard, sample, min_bytes, max_bytes);
}
inline std::string TarSampleKey(uint64_t shard, uint64_t sample) {
  return dataset::synthetic::SampleKey(shard, sample);
}

// Megatron dataset: root/name/part-00000.bin + .idx ...; uint16 tokens, sequence lengths in
// [min_tokens, max_tokens], one document per sequence; sequence q of shard s holds
// TokenRecordBytes(seed, s, q, its length).
Result<dataset::DatasetPtr> MakeMegatronDataset(const std::string& root, const std::string& name,
                                                int shards, uint64_t sequences_per_shard,
                                                uint64_t min_tokens = 16,
                                                uint64_t max_tokens = 2048,
                                                uint64_t chunk_bytes = dataset::kDefaultChunkBytes,
                                                uint64_t seed = 1);

}  // namespace shardcache::testing
