#include "dataset/packer.h"

#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <string_view>
#include <utility>
#include <vector>

#include "common/fs.h"
#include "common/random.h"
#include "dataset/indexer.h"
#include "dataset/parallel_for.h"
#include "dataset/tar_writer.h"
#include "dataset/utf8.h"

namespace shardcache::dataset {

namespace fs = std::filesystem;

namespace {

// Appends `in` with '%', bytes that are not valid UTF-8 and (escape_leading_dot) a '.' at its
// start %XX-escaped.
void Escape(std::string_view in, bool escape_leading_dot, std::string* out) {
  static const char* kHex = "0123456789ABCDEF";
  for (size_t i = 0; i < in.size();) {
    const size_t n = Utf8SequenceLength(in, i);
    const char c = in[i];
    if (n == 0 || c == '%' || (c == '.' && i == 0 && escape_leading_dot)) {
      const auto b = static_cast<unsigned char>(c);
      *out += '%';
      *out += kHex[b >> 4];
      *out += kHex[b & 0xF];
      ++i;
    } else {
      out->append(in, i, n);
      i += n;
    }
  }
}

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Position of the '.' that ends the WebDataset key of `member` (its basename's first '.').
size_t KeyEnd(std::string_view member) {
  const size_t slash = member.rfind('/');
  return member.find('.', slash == std::string_view::npos ? 0 : slash + 1);
}

struct SourceFile {
  std::string rel;
  std::string member;
  std::string_view key() const { return std::string_view(member).substr(0, KeyEnd(member)); }
  std::string_view ext() const { return std::string_view(member).substr(KeyEnd(member) + 1); }
  uint64_t size_bytes = 0;
  int64_t mtime = 0;
  uint32_t mode = 0644;
};

// The files in the order they are packed: each sample's files (those sharing a key) together,
// by extension; the samples in key order, then shuffled with `seed` when there is one.
std::vector<SourceFile> InPackOrder(std::vector<SourceFile> files, std::optional<uint64_t> seed) {
  std::sort(files.begin(), files.end(), [](const SourceFile& a, const SourceFile& b) {
    // Not by member name: "a.b/x.jpg" sorts between "a.aaa" and "a.cls" and would split sample "a".
    return std::pair(a.key(), a.ext()) < std::pair(b.key(), b.ext());
  });
  if (!seed) return files;
  std::vector<std::pair<size_t, size_t>> samples;  // [begin, end) in files
  for (size_t i = 0; i < files.size(); ++i) {
    if (i == 0 || files[i].key() != files[i - 1].key()) samples.emplace_back(i, i);
    samples.back().second = i + 1;
  }
  SplitMix64 rng(*seed);
  Shuffle(samples.data(), samples.size(), rng);
  std::vector<SourceFile> out;
  out.reserve(files.size());
  for (const auto& [begin, end] : samples) {
    for (size_t i = begin; i < end; ++i) out.push_back(std::move(files[i]));
  }
  return out;
}

}  // namespace

std::string PackedMemberName(const std::string& rel) {
  const size_t slash = rel.rfind('/');
  const size_t base = slash == std::string::npos ? 0 : slash + 1;
  std::string out;
  Escape(std::string_view(rel).substr(0, base), /*escape_leading_dot=*/false, &out);
  const size_t base_out = out.size();
  Escape(std::string_view(rel).substr(base), /*escape_leading_dot=*/true, &out);
  size_t dot = out.find('.', base_out);
  if (dot == out.size() - 1) {  // "a." -> "a%2E.", distinct from "a" -> "a."
    out.replace(dot, 1, "%2E");
    dot = std::string::npos;
  }
  if (dot == std::string::npos) out += '.';  // no extension: "README" -> "README."
  return out;
}

Result<std::string> DecodePackedName(const std::string& member) {
  const size_t dot = KeyEnd(member);
  if (dot == std::string::npos) return InvalidArgument("'" + member + "' has no extension dot");
  // The dot PackedMemberName appended to a basename without one.
  const size_t end = dot == member.size() - 1 ? dot : member.size();
  std::string out;
  for (size_t i = 0; i < end; ++i) {
    if (member[i] != '%') {
      out += member[i];
      continue;
    }
    const int hi = i + 2 < end ? HexValue(member[i + 1]) : -1;
    const int lo = i + 2 < end ? HexValue(member[i + 2]) : -1;
    if (hi < 0 || lo < 0) {
      return InvalidArgument("'" + member + "' has a bad escape at " + std::to_string(i));
    }
    out += static_cast<char>(hi * 16 + lo);
    i += 2;
  }
  return out;
}

Result<PackResult> PackDirectory(const std::string& src, const std::string& out,
                                 const PackOptions& options) {
  if (options.shard_bytes == 0) return InvalidArgument("shard size must be positive");
  std::error_code ec;
  if (!fs::is_directory(src, ec)) return NotFound(src + " is not a directory");
  const fs::path src_abs = fs::weakly_canonical(fs::absolute(src));
  const fs::path out_abs = fs::weakly_canonical(fs::absolute(out));
  {
    const std::string s = src_abs.string() + "/", o = out_abs.string() + "/";
    if (o.compare(0, s.size(), s) == 0) {
      return InvalidArgument("output directory " + out + " must not lie inside the source " + src);
    }
  }
  if (fs::exists(out_abs, ec)) {
    if (!fs::is_directory(out_abs, ec)) return FailedPrecondition(out + " is not a directory");
    if (!fs::is_empty(out_abs, ec)) {
      return FailedPrecondition("output directory " + out +
                                " is not empty; pack writes a fresh dataset");
    }
  }

  // Collect the source files.
  std::vector<SourceFile> files;
  fs::recursive_directory_iterator it(src_abs, ec), end;
  if (ec) return ErrnoStatus(ec.value(), "list " + src);
  for (; it != end; it.increment(ec)) {
    if (ec) return ErrnoStatus(ec.value(), "list " + src);
    if (it.depth() == 0 && it->path().filename() == kMetaDirName) {
      it.disable_recursion_pending();
      continue;
    }
    std::error_code sec;
    if (!it->is_regular_file(sec)) continue;
    struct stat st;
    const std::string abs = it->path().string();
    if (::stat(abs.c_str(), &st) != 0) return ErrnoStatus(errno, "stat " + abs);
    SourceFile f;
    f.rel = it->path().lexically_relative(src_abs).generic_string();
    f.member = PackedMemberName(f.rel);
    f.size_bytes = static_cast<uint64_t>(st.st_size);
    f.mtime = st.st_mtime;
    f.mode = st.st_mode & 0777;
    files.push_back(std::move(f));
  }
  if (files.empty()) return NotFound(src + ": no files to pack");
  files = InPackOrder(std::move(files), options.shuffle_seed);

  // Plan shards: [first file, end file) per shard, splitting only between samples.
  std::vector<size_t> shard_begin{0};
  uint64_t shard_size = 2 * 512;  // end-of-archive blocks
  uint64_t total_bytes = 0;
  for (size_t i = 0; i < files.size();) {
    size_t j = i;
    uint64_t sample_bytes = 0;
    for (; j < files.size() && files[j].key() == files[i].key(); ++j) {
      sample_bytes += TarWriter::MemberBytes(files[j].member, files[j].size_bytes);
      total_bytes += files[j].size_bytes;
    }
    if (i > shard_begin.back() && shard_size + sample_bytes > options.shard_bytes) {
      shard_begin.push_back(i);
      shard_size = 2 * 512;
    }
    shard_size += sample_bytes;
    i = j;
  }
  shard_begin.push_back(files.size());
  const size_t shards = shard_begin.size() - 1;

  SC_RETURN_IF_ERROR(MakeDirs(out_abs.string()));
  std::atomic<uint64_t> done_bytes{0};
  std::function<void()> tick;
  if (options.progress) {
    tick = [&] { options.progress("pack", done_bytes.load(std::memory_order_relaxed), total_bytes); };
  }
  SC_RETURN_IF_ERROR(ParallelFor(shards, options.threads, [&](uint64_t s) -> Status {
    char name[64];
    std::snprintf(name, sizeof name, "/shard-%06llu.tar", static_cast<unsigned long long>(s));
    SC_ASSIGN_OR_RETURN(auto w, TarWriter::Create(out_abs.string() + name));
    for (size_t i = shard_begin[s]; i < shard_begin[s + 1]; ++i) {
      const SourceFile& f = files[i];
      SC_RETURN_IF_ERROR(w->AddFile(f.member, (src_abs / f.rel).string(), f.size_bytes, f.mtime,
                                    f.mode));
      done_bytes.fetch_add(f.size_bytes, std::memory_order_relaxed);
    }
    return w->Finish();
  }, tick));

  IndexOptions io;
  io.name = options.name;
  io.format = v1::TAR;
  io.chunk_bytes = options.chunk_bytes;
  io.threads = options.threads;
  if (options.progress) {
    io.progress = [&](uint64_t done, uint64_t total) { options.progress("index", done, total); };
  }
  PackResult result;
  SC_ASSIGN_OR_RETURN(result.dataset, IndexDirectory(out_abs.string(), io));
  result.files = files.size();
  result.file_bytes = total_bytes;
  return result;
}

}  // namespace shardcache::dataset
