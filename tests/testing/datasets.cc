#include "testing/datasets.h"

#include <fcntl.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "common/fs.h"
#include "dataset/indexer.h"
#include "dataset/megatron_format.h"
#include "dataset/tar_writer.h"

namespace shardcache::testing {

namespace {

uint64_t SplitMix(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

uint64_t Mix(uint64_t seed, uint64_t a, uint64_t b) {
  uint64_t s = seed * 0x9E3779B97F4A7C15ull ^ (a + 0x632BE59BD9B4E019ull) * 0xD6E8FEB86659FD93ull ^
               (b + 1) * 0xFF51AFD7ED558CCDull;
  SplitMix(s);
  return s;
}

void FillRandom(uint64_t state, char* out, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const uint64_t v = SplitMix(state);
    std::memcpy(out + i, &v, 8);
  }
  if (i < n) {
    const uint64_t v = SplitMix(state);
    std::memcpy(out + i, &v, n - i);
  }
}

std::string ShardName(const char* stem, int shard, const char* ext) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%s-%05d%s", stem, shard, ext);
  return buf;
}

Status WriteWhole(const std::string& path, const std::string& data) {
  SC_ASSIGN_OR_RETURN(UniqueFd fd, OpenFile(path, O_WRONLY | O_CREAT | O_TRUNC, 0644));
  return PwriteFull(fd.get(), data.data(), data.size(), 0, path);
}

// Zipf(1)-like token table: id = floor(V^u) - 1 for uniform u has density ~ 1/id.
const std::vector<uint16_t>& ZipfTable() {
  static const std::vector<uint16_t> table = [] {
    constexpr int kEntries = 1 << 16;
    constexpr double kVocab = 50000;
    std::vector<uint16_t> t(kEntries);
    for (int i = 0; i < kEntries; ++i) {
      const double u = (i + 0.5) / kEntries;
      t[i] = static_cast<uint16_t>(std::floor(std::pow(kVocab, u)) - 1);
    }
    return t;
  }();
  return table;
}

}  // namespace

std::string RecordBytes(uint64_t seed, uint64_t shard, uint64_t record, uint64_t record_bytes) {
  std::string out(record_bytes, '\0');
  FillRandom(Mix(seed, shard, record), out.data(), out.size());
  return out;
}

std::string TokenRecordBytes(uint64_t seed, uint64_t shard, uint64_t record,
                             uint64_t tokens_per_record) {
  const auto& table = ZipfTable();
  std::string out(tokens_per_record * 2, '\0');
  uint64_t state = Mix(seed ^ 0x70CE75, shard, record);
  for (uint64_t t = 0; t < tokens_per_record; t += 4) {
    const uint64_t r = SplitMix(state);
    for (uint64_t k = 0; k < 4 && t + k < tokens_per_record; ++k) {
      const uint16_t id = table[(r >> (16 * k)) & 0xFFFF];
      std::memcpy(out.data() + (t + k) * 2, &id, 2);
    }
  }
  return out;
}

std::string TarJpgBytes(uint64_t seed, uint64_t shard, uint64_t sample, uint64_t min_bytes,
                        uint64_t max_bytes) {
  uint64_t state = Mix(seed ^ 0x7A5, shard, sample);
  const uint64_t span = max_bytes >= min_bytes ? max_bytes - min_bytes + 1 : 1;
  const uint64_t size = min_bytes + SplitMix(state) % span;
  std::string out(size, '\0');
  FillRandom(state, out.data(), out.size());
  if (size >= 2) {  // JPEG SOI marker, so the bytes at least start like a JPEG
    out[0] = static_cast<char>(0xFF);
    out[1] = static_cast<char>(0xD8);
  }
  return out;
}

std::string TarSampleKey(uint64_t shard, uint64_t sample) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "s%05llu-%08llu", static_cast<unsigned long long>(shard),
                static_cast<unsigned long long>(sample));
  return buf;
}

Result<dataset::DatasetPtr> MakeRecordsDataset(const std::string& root, const std::string& name,
                                               int shards, uint64_t records_per_shard,
                                               uint64_t record_bytes, uint64_t chunk_bytes,
                                               uint64_t seed) {
  const std::string dir = root + "/" + name;
  SC_RETURN_IF_ERROR(MakeDirs(dir));
  for (int s = 0; s < shards; ++s) {
    std::string data(records_per_shard * record_bytes, '\0');
    for (uint64_t r = 0; r < records_per_shard; ++r) {
      FillRandom(Mix(seed, static_cast<uint64_t>(s), r), data.data() + r * record_bytes,
                 record_bytes);
    }
    SC_RETURN_IF_ERROR(WriteWhole(dir + "/" + ShardName("shard", s, ".bin"), data));
  }
  dataset::IndexOptions o;
  o.name = name;
  o.format = v1::RECORDS;
  o.record_bytes = record_bytes;
  o.chunk_bytes = chunk_bytes;
  return dataset::IndexDirectory(dir, o);
}

Result<dataset::DatasetPtr> MakeTokenDataset(const std::string& root, const std::string& name,
                                             int shards, uint64_t records_per_shard,
                                             uint64_t tokens_per_record, uint64_t chunk_bytes,
                                             uint64_t seed) {
  const std::string dir = root + "/" + name;
  SC_RETURN_IF_ERROR(MakeDirs(dir));
  for (int s = 0; s < shards; ++s) {
    std::string data;
    data.reserve(records_per_shard * tokens_per_record * 2);
    for (uint64_t r = 0; r < records_per_shard; ++r) {
      data += TokenRecordBytes(seed, static_cast<uint64_t>(s), r, tokens_per_record);
    }
    SC_RETURN_IF_ERROR(WriteWhole(dir + "/" + ShardName("shard", s, ".bin"), data));
  }
  dataset::IndexOptions o;
  o.name = name;
  o.format = v1::RECORDS;
  o.record_bytes = tokens_per_record * 2;
  o.chunk_bytes = chunk_bytes;
  return dataset::IndexDirectory(dir, o);
}

Result<dataset::DatasetPtr> MakeTarDataset(const std::string& root, const std::string& name,
                                           int shards, uint64_t samples_per_shard,
                                           uint64_t min_bytes, uint64_t max_bytes,
                                           uint64_t chunk_bytes, uint64_t seed) {
  const std::string dir = root + "/" + name;
  SC_RETURN_IF_ERROR(MakeDirs(dir));
  for (int s = 0; s < shards; ++s) {
    SC_ASSIGN_OR_RETURN(auto w,
                        dataset::TarWriter::Create(dir + "/" + ShardName("shard", s, ".tar")));
    for (uint64_t k = 0; k < samples_per_shard; ++k) {
      const std::string key = TarSampleKey(static_cast<uint64_t>(s), k);
      SC_RETURN_IF_ERROR(w->AddBytes(
          key + ".jpg", TarJpgBytes(seed, static_cast<uint64_t>(s), k, min_bytes, max_bytes)));
      SC_RETURN_IF_ERROR(w->AddBytes(key + ".cls", std::to_string(k % 1000)));
    }
    SC_RETURN_IF_ERROR(w->Finish(/*fsync=*/false));
  }
  dataset::IndexOptions o;
  o.name = name;
  o.format = v1::TAR;
  o.chunk_bytes = chunk_bytes;
  return dataset::IndexDirectory(dir, o);
}

Result<dataset::DatasetPtr> MakeMegatronDataset(const std::string& root, const std::string& name,
                                                int shards, uint64_t sequences_per_shard,
                                                uint64_t min_tokens, uint64_t max_tokens,
                                                uint64_t chunk_bytes, uint64_t seed) {
  const std::string dir = root + "/" + name;
  SC_RETURN_IF_ERROR(MakeDirs(dir));
  const uint64_t span = max_tokens >= min_tokens ? max_tokens - min_tokens + 1 : 1;
  for (int s = 0; s < shards; ++s) {
    uint64_t state = Mix(seed ^ 0x3E6A, static_cast<uint64_t>(s), 0);
    std::vector<int32_t> lengths(sequences_per_shard);
    std::string bin;
    for (uint64_t q = 0; q < sequences_per_shard; ++q) {
      lengths[q] = static_cast<int32_t>(min_tokens + SplitMix(state) % span);
      bin += TokenRecordBytes(seed, static_cast<uint64_t>(s), q, static_cast<uint64_t>(lengths[q]));
    }
    SC_RETURN_IF_ERROR(WriteWhole(dir + "/" + ShardName("part", s, ".bin"), bin));
    SC_RETURN_IF_ERROR(WriteWhole(dir + "/" + ShardName("part", s, ".idx"),
                                  dataset::MakeMegatronIndex(lengths, /*uint16*/ 8)));
  }
  dataset::IndexOptions o;
  o.name = name;
  o.format = v1::MEGATRON;
  o.chunk_bytes = chunk_bytes;
  return dataset::IndexDirectory(dir, o);
}

}  // namespace shardcache::testing
