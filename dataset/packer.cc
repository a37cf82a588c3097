#include "dataset/packer.h"

#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <vector>

#include "common/fs.h"
#include "dataset/indexer.h"
#include "dataset/parallel_for.h"
#include "dataset/tar_writer.h"
#include "dataset/utf8.h"

namespace shardcache::dataset {

namespace fs = std::filesystem;

namespace {

// %XX-escapes '%', bytes that are not valid UTF-8, and (in keys) '/' and '.'.
void Escape(const std::string& in, bool is_key, std::string* out) {
  static const char* kHex = "0123456789ABCDEF";
  for (size_t i = 0; i < in.size();) {
    const size_t n = Utf8SequenceLength(in, i);
    const char c = in[i];
    if (n == 0 || c == '%' || (is_key && (c == '/' || c == '.'))) {
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

struct SourceFile {
  std::string rel;
  std::string member;
  std::string key;
  uint64_t size_bytes = 0;
  int64_t mtime = 0;
  uint32_t mode = 0644;
};

}  // namespace

std::string PackedMemberName(const std::string& rel) {
  const size_t slash = rel.rfind('/');
  const size_t base = slash == std::string::npos ? 0 : slash + 1;
  size_t dot = rel.find('.', base);
  if (dot == base) dot = rel.find('.', base + 1);  // ".hidden.txt": the leading dot is the stem's
  if (dot == rel.size() - 1) dot = std::string::npos;  // "a.": escaped whole, so "a" stays distinct
  std::string out;
  Escape(dot == std::string::npos ? rel : rel.substr(0, dot), /*is_key=*/true, &out);
  out += '.';
  if (dot != std::string::npos) Escape(rel.substr(dot + 1), /*is_key=*/false, &out);
  return out;
}

Result<std::string> DecodePackedName(const std::string& member) {
  const size_t dot = member.find('.');
  if (dot == std::string::npos) return InvalidArgument("'" + member + "' has no extension dot");
  std::string out;
  for (size_t i = 0; i < member.size(); ++i) {
    if (i == dot) {
      if (dot + 1 < member.size()) out += '.';
      continue;
    }
    if (member[i] != '%') {
      out += member[i];
      continue;
    }
    const int hi = i + 2 < member.size() ? HexValue(member[i + 1]) : -1;
    const int lo = i + 2 < member.size() ? HexValue(member[i + 2]) : -1;
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
    f.key = f.member.substr(0, f.member.find('.'));
    f.size_bytes = static_cast<uint64_t>(st.st_size);
    f.mtime = st.st_mtime;
    f.mode = st.st_mode & 0777;
    files.push_back(std::move(f));
  }
  if (files.empty()) return NotFound(src + ": no files to pack");
  std::sort(files.begin(), files.end(), [](const SourceFile& a, const SourceFile& b) {
    return a.member < b.member;  // key has no '.', so this orders by (key, ext)
  });

  // Plan shards: [first file, end file) per shard, splitting only between samples.
  std::vector<size_t> shard_begin{0};
  uint64_t shard_size = 2 * 512;  // end-of-archive blocks
  uint64_t total_bytes = 0;
  for (size_t i = 0; i < files.size();) {
    size_t j = i;
    uint64_t sample_bytes = 0;
    for (; j < files.size() && files[j].key == files[i].key; ++j) {
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
