#include "testing/datasets.h"

#include <cstdio>

#include "common/fs.h"
#include "dataset/indexer.h"

namespace shardcache::testing {

namespace syn = dataset::synthetic;

namespace {

std::string ShardName(const std::string& dir, const char* stem, int shard, const char* ext) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "/%s-%05d%s", stem, shard, ext);
  return dir + buf;
}

Result<dataset::DatasetPtr> Index(const std::string& dir, const std::string& name,
                                  v1::ShardFormat format, uint64_t record_bytes,
                                  uint64_t chunk_bytes) {
  dataset::IndexOptions o;
  o.name = name;
  o.format = format;
  o.record_bytes = record_bytes;
  o.chunk_bytes = chunk_bytes;
  return dataset::IndexDirectory(dir, o);
}

}  // namespace

Result<dataset::DatasetPtr> MakeRecordsDataset(const std::string& root, const std::string& name,
                                               int shards, uint64_t records_per_shard,
                                               uint64_t record_bytes, uint64_t chunk_bytes,
                                               uint64_t seed) {
  const std::string dir = root + "/" + name;
  SC_RETURN_IF_ERROR(MakeDirs(dir));
  for (int s = 0; s < shards; ++s) {
    SC_RETURN_IF_ERROR(syn::WriteRecordsShard(ShardName(dir, "shard", s, ".bin"),
                                              syn::RecordKind::kRandom, seed,
                                              static_cast<uint64_t>(s), records_per_shard,
                                              record_bytes));
  }
  return Index(dir, name, v1::RECORDS, record_bytes, chunk_bytes);
}

Result<dataset::DatasetPtr> MakeTokenDataset(const std::string& root, const std::string& name,
                                             int shards, uint64_t records_per_shard,
                                             uint64_t tokens_per_record, uint64_t chunk_bytes,
                                             uint64_t seed) {
  const std::string dir = root + "/" + name;
  SC_RETURN_IF_ERROR(MakeDirs(dir));
  for (int s = 0; s < shards; ++s) {
    SC_RETURN_IF_ERROR(syn::WriteRecordsShard(ShardName(dir, "shard", s, ".bin"),
                                              syn::RecordKind::kTokens, seed,
                                              static_cast<uint64_t>(s), records_per_shard,
                                              tokens_per_record * 2));
  }
  return Index(dir, name, v1::RECORDS, tokens_per_record * 2, chunk_bytes);
}

Result<dataset::DatasetPtr> MakeTarDataset(const std::string& root, const std::string& name,
                                           int shards, uint64_t samples_per_shard,
                                           uint64_t min_bytes, uint64_t max_bytes,
                                           uint64_t chunk_bytes, uint64_t seed) {
  const std::string dir = root + "/" + name;
  SC_RETURN_IF_ERROR(MakeDirs(dir));
  for (int s = 0; s < shards; ++s) {
    SC_RETURN_IF_ERROR(syn::WriteTarShard(ShardName(dir, "shard", s, ".tar"), seed,
                                          static_cast<uint64_t>(s), samples_per_shard, min_bytes,
                                          max_bytes));
  }
  return Index(dir, name, v1::TAR, 0, chunk_bytes);
}

Result<dataset::DatasetPtr> MakeMegatronDataset(const std::string& root, const std::string& name,
                                                int shards, uint64_t sequences_per_shard,
                                                uint64_t min_tokens, uint64_t max_tokens,
                                                uint64_t chunk_bytes, uint64_t seed) {
  const std::string dir = root + "/" + name;
  SC_RETURN_IF_ERROR(MakeDirs(dir));
  for (int s = 0; s < shards; ++s) {
    SC_RETURN_IF_ERROR(syn::WriteMegatronShard(
        ShardName(dir, "part", s, ".bin"), ShardName(dir, "part", s, ".idx"), seed,
        static_cast<uint64_t>(s), sequences_per_shard, min_tokens, max_tokens));
  }
  return Index(dir, name, v1::MEGATRON, 0, chunk_bytes);
}

}  // namespace shardcache::testing
