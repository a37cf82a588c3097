#include "dataset/synthetic.h"

#include <fcntl.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "common/fs.h"
#include "dataset/megatron_format.h"
#include "dataset/tar_writer.h"

namespace shardcache::dataset::synthetic {

namespace {

constexpr size_t kWriteBufferBytes = 8 << 20;

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

void FillTokens(uint64_t state, char* out, size_t tokens) {
  const auto& table = ZipfTable();
  for (size_t t = 0; t < tokens; t += 4) {
    const uint64_t r = SplitMix(state);
    for (size_t k = 0; k < 4 && t + k < tokens; ++k) {
      const uint16_t id = table[(r >> (16 * k)) & 0xFFFF];
      std::memcpy(out + (t + k) * 2, &id, 2);
    }
  }
}

// Buffered sequential writer for scratch files.
class BufferedFile {
 public:
  static Result<BufferedFile> Create(const std::string& path) {
    SC_ASSIGN_OR_RETURN(UniqueFd fd, OpenFile(path, O_WRONLY | O_CREAT | O_TRUNC, 0644));
    return BufferedFile(path, std::move(fd));
  }
  // Returns space for n bytes at the end of the buffer, flushing first when full.
  Result<char*> Reserve(size_t n) {
    if (buf_.size() + n > kWriteBufferBytes && !buf_.empty()) SC_RETURN_IF_ERROR(Flush());
    const size_t old = buf_.size();
    buf_.resize(old + n);
    return buf_.data() + old;
  }
  Status Flush() {
    SC_RETURN_IF_ERROR(PwriteFull(fd_.get(), buf_.data(), buf_.size(), written_, path_));
    written_ += buf_.size();
    buf_.clear();
    return Status::Ok();
  }

 private:
  BufferedFile(std::string path, UniqueFd fd) : path_(std::move(path)), fd_(std::move(fd)) {
    buf_.reserve(kWriteBufferBytes);
  }
  std::string path_;
  UniqueFd fd_;
  std::string buf_;
  uint64_t written_ = 0;
};

}  // namespace

void FillRecord(RecordKind kind, uint64_t seed, uint64_t shard, uint64_t record, char* out,
                size_t n) {
  if (kind == RecordKind::kTokens) {
    FillTokens(Mix(seed ^ 0x70CE75, shard, record), out, n / 2);
    if (n % 2) FillRandom(Mix(seed, shard, record), out + n - 1, 1);
  } else {
    FillRandom(Mix(seed, shard, record), out, n);
  }
}

std::string RecordBytes(uint64_t seed, uint64_t shard, uint64_t record, uint64_t record_bytes) {
  std::string out(record_bytes, '\0');
  FillRecord(RecordKind::kRandom, seed, shard, record, out.data(), out.size());
  return out;
}

std::string TokenRecordBytes(uint64_t seed, uint64_t shard, uint64_t record,
                             uint64_t tokens_per_record) {
  std::string out(tokens_per_record * 2, '\0');
  FillRecord(RecordKind::kTokens, seed, shard, record, out.data(), out.size());
  return out;
}

std::string JpgLikeBytes(uint64_t seed, uint64_t shard, uint64_t item, uint64_t min_bytes,
                         uint64_t max_bytes) {
  uint64_t state = Mix(seed ^ 0x7A5, shard, item);
  const uint64_t span = max_bytes >= min_bytes ? max_bytes - min_bytes + 1 : 1;
  const uint64_t size = min_bytes + SplitMix(state) % span;
  std::string out(size, '\0');
  FillRandom(state, out.data(), out.size());
  if (size >= 2) {
    out[0] = static_cast<char>(0xFF);
    out[1] = static_cast<char>(0xD8);
  }
  return out;
}

std::string SampleKey(uint64_t shard, uint64_t sample) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "s%05llu-%08llu", static_cast<unsigned long long>(shard),
                static_cast<unsigned long long>(sample));
  return buf;
}

Status WriteRecordsShard(const std::string& path, RecordKind kind, uint64_t seed, uint64_t shard,
                         uint64_t records, uint64_t record_bytes) {
  SC_ASSIGN_OR_RETURN(BufferedFile f, BufferedFile::Create(path));
  for (uint64_t r = 0; r < records; ++r) {
    SC_ASSIGN_OR_RETURN(char* p, f.Reserve(record_bytes));
    FillRecord(kind, seed, shard, r, p, record_bytes);
  }
  return f.Flush();
}

Status WriteTarShard(const std::string& path, uint64_t seed, uint64_t shard, uint64_t samples,
                     uint64_t min_bytes, uint64_t max_bytes) {
  SC_ASSIGN_OR_RETURN(auto w, TarWriter::Create(path));
  for (uint64_t k = 0; k < samples; ++k) {
    const std::string key = SampleKey(shard, k);
    SC_RETURN_IF_ERROR(w->AddBytes(key + ".jpg", JpgLikeBytes(seed, shard, k, min_bytes, max_bytes)));
    SC_RETURN_IF_ERROR(w->AddBytes(key + ".cls", std::to_string(k % 1000)));
  }
  return w->Finish(/*fsync=*/false);
}

Status WriteMegatronShard(const std::string& bin_path, const std::string& idx_path,
                          uint64_t seed, uint64_t shard, uint64_t sequences, uint64_t min_tokens,
                          uint64_t max_tokens) {
  if (max_tokens > static_cast<uint64_t>(INT32_MAX)) {
    return InvalidArgument("megatron sequences hold at most 2^31-1 tokens");
  }
  uint64_t state = Mix(seed ^ 0x3E6A, shard, 0);
  const uint64_t span = max_tokens >= min_tokens ? max_tokens - min_tokens + 1 : 1;
  std::vector<int32_t> lengths(sequences);
  SC_ASSIGN_OR_RETURN(BufferedFile f, BufferedFile::Create(bin_path));
  for (uint64_t q = 0; q < sequences; ++q) {
    lengths[q] = static_cast<int32_t>(min_tokens + SplitMix(state) % span);
    const size_t n = static_cast<size_t>(lengths[q]) * 2;
    SC_ASSIGN_OR_RETURN(char* p, f.Reserve(n));
    FillRecord(RecordKind::kTokens, seed, shard, q, p, n);
  }
  SC_RETURN_IF_ERROR(f.Flush());
  const std::string idx = MakeMegatronIndex(lengths, /*uint16*/ 8);
  SC_ASSIGN_OR_RETURN(BufferedFile fi, BufferedFile::Create(idx_path));
  SC_ASSIGN_OR_RETURN(char* p, fi.Reserve(idx.size()));
  std::memcpy(p, idx.data(), idx.size());
  return fi.Flush();
}

Status WriteFileTree(const std::string& out, uint64_t seed, uint64_t count, uint64_t min_bytes,
                     uint64_t max_bytes, uint64_t dirs, uint64_t* bytes) {
  if (dirs == 0) dirs = 1;
  uint64_t total = 0;
  for (uint64_t d = 0; d < dirs && d < (count + 1) / 2; ++d) {
    char dir[64];
    std::snprintf(dir, sizeof dir, "/train/class-%03llu", static_cast<unsigned long long>(d));
    SC_RETURN_IF_ERROR(MakeDirs(out + dir));
  }
  for (uint64_t i = 0; i < count; ++i) {
    const uint64_t sample = i / 2;
    char name[96];
    std::snprintf(name, sizeof name, "/train/class-%03llu/img-%08llu.%s",
                  static_cast<unsigned long long>(sample % dirs),
                  static_cast<unsigned long long>(sample), i % 2 == 0 ? "jpg" : "cls");
    const std::string data = i % 2 == 0 ? JpgLikeBytes(seed, 0, sample, min_bytes, max_bytes)
                                        : std::to_string(sample % dirs) + "\n";
    const std::string path = out + name;
    SC_ASSIGN_OR_RETURN(UniqueFd fd, OpenFile(path, O_WRONLY | O_CREAT | O_TRUNC, 0644));
    SC_RETURN_IF_ERROR(PwriteFull(fd.get(), data.data(), data.size(), 0, path));
    total += data.size();
  }
  if (bytes) *bytes = total;
  return Status::Ok();
}

}  // namespace shardcache::dataset::synthetic
