#include "dataset/tar_format.h"

#include <algorithm>
#include <cstring>
#include <optional>

#include "dataset/manifest.h"
#include "dataset/utf8.h"

namespace shardcache::dataset {

bool SplitWebDatasetKey(const std::string& path, std::string* key, std::string* ext) {
  const size_t slash = path.rfind('/');
  const size_t base = slash == std::string::npos ? 0 : slash + 1;
  const size_t dot = path.find('.', base);
  if (dot == std::string::npos || dot == base) return false;
  *key = path.substr(0, dot);
  *ext = path.substr(dot + 1);
  return true;
}

namespace {

constexpr uint64_t kBlock = kTarBlockBytes;
constexpr size_t kWindowBytes = 64 * 1024;

std::string At(const ByteSource& src, uint64_t offset) {
  return src.name() + " at offset " + std::to_string(offset);
}

// Reads header blocks through a window so a tar of many small members costs one read per
// window rather than one per header.
class WindowReader {
 public:
  explicit WindowReader(const ByteSource& src) : src_(src) {}
  // Returns a pointer to n bytes at offset, valid until the next call.
  // REQUIRES: [offset, offset + n) lies inside the source; n <= kWindowBytes.
  Result<const char*> Read(uint64_t offset, size_t n) {
    if (offset < buf_offset_ || offset + n > buf_offset_ + buf_.size()) {
      const size_t want =
          static_cast<size_t>(std::min<uint64_t>(kWindowBytes, src_.size() - offset));
      buf_.resize(std::max(want, n));
      SC_RETURN_IF_ERROR(src_.ReadAt(offset, buf_.data(), buf_.size()));
      buf_offset_ = offset;
    }
    return static_cast<const char*>(buf_.data() + (offset - buf_offset_));
  }

 private:
  const ByteSource& src_;
  std::string buf_;
  uint64_t buf_offset_ = 0;
};

// Numeric header field: octal ASCII with optional leading spaces and a NUL/space terminator, or
// GNU base-256 (high bit of the first byte set; negative values refused).
bool ParseNumeric(const char* field, size_t len, uint64_t* out) {
  const auto* f = reinterpret_cast<const unsigned char*>(field);
  if (len > 0 && (f[0] & 0x80)) {
    if (f[0] & 0x40) return false;
    uint64_t v = f[0] & 0x3f;
    for (size_t i = 1; i < len; ++i) {
      if (v >> 55) return false;  // would exceed 2^63
      v = (v << 8) | f[i];
    }
    *out = v;
    return true;
  }
  size_t i = 0;
  while (i < len && f[i] == ' ') ++i;
  uint64_t v = 0;
  for (; i < len; ++i) {
    const unsigned char c = f[i];
    if (c >= '0' && c <= '7') {
      if (v >> 60) return false;
      v = v * 8 + (c - '0');
    } else if (c == ' ' || c == '\0') {
      break;
    } else {
      return false;
    }
  }
  for (; i < len; ++i) {
    if (f[i] != ' ' && f[i] != '\0') return false;
  }
  *out = v;
  return true;
}

bool AllZero(const char* block) {
  for (uint64_t i = 0; i < kBlock; ++i) {
    if (block[i] != 0) return false;
  }
  return true;
}

std::string CString(const char* field, size_t len) {
  return std::string(field, strnlen(field, len));
}

struct PaxState {
  std::optional<std::string> path;
  std::optional<uint64_t> size;
  std::optional<std::string> long_name;  // GNU 'L'
  uint64_t first_meta_offset = UINT64_MAX;
  void Clear() { *this = PaxState(); }
};

// Parses pax extended header records "<len> <key>=<value>\n" into `pax`.
Status ParsePaxRecords(std::string_view data, const ByteSource& src, uint64_t data_offset,
                       PaxState* pax) {
  size_t pos = 0;
  while (pos < data.size()) {
    // Some writers pad the record area with NULs.
    if (data[pos] == '\0') break;
    size_t p = pos;
    uint64_t len = 0;
    while (p < data.size() && data[p] >= '0' && data[p] <= '9') {
      if (len > data.size()) break;
      len = len * 10 + static_cast<uint64_t>(data[p] - '0');
      ++p;
    }
    if (p == pos || p >= data.size() || data[p] != ' ' || len <= p - pos + 1 ||
        len > data.size() - pos || data[pos + len - 1] != '\n') {
      return DataLoss(At(src, data_offset + pos) + ": malformed pax extended header record");
    }
    const std::string_view rec = data.substr(p + 1, pos + len - 1 - (p + 1));
    const size_t eq = rec.find('=');
    if (eq == std::string_view::npos || eq == 0) {
      return DataLoss(At(src, data_offset + pos) + ": pax record without key=value");
    }
    const std::string_view key = rec.substr(0, eq), value = rec.substr(eq + 1);
    if (key == "path") {
      pax->path = std::string(value);
    } else if (key == "size") {
      uint64_t v = 0;
      if (value.empty() || value.size() > 19) {
        return DataLoss(At(src, data_offset + pos) + ": pax size '" + std::string(value) +
                        "' is not a decimal byte count");
      }
      for (char c : value) {
        if (c < '0' || c > '9') {
          return DataLoss(At(src, data_offset + pos) + ": pax size '" + std::string(value) +
                          "' is not a decimal byte count");
        }
        v = v * 10 + static_cast<uint64_t>(c - '0');
      }
      pax->size = v;
    } else if (key.substr(0, 11) == "GNU.sparse.") {
      return InvalidArgument(At(src, data_offset + pos) +
                             ": GNU sparse members are not supported in tar shards");
    }
    pos += len;
  }
  return Status::Ok();
}

bool IsMetaType(char t) { return t == 'x' || t == 'g' || t == 'L' || t == 'K'; }

// POSIX: links, devices, directories and FIFOs have no data blocks whatever `size` says.
bool HasNoData(char t) { return t >= '1' && t <= '6'; }

}  // namespace

Result<v1::SampleIndex> IndexTarShard(const ByteSource& src) {
  v1::SampleIndex idx;
  idx.set_format_version(kSampleIndexFormatVersion);
  const uint64_t size = src.size();
  WindowReader reader(src);
  PaxState pax;
  std::string group_key;
  uint64_t group_start = 0, group_end = 0;
  bool in_group = false;
  auto close_group = [&] {
    if (!in_group) return;
    idx.add_offsets(group_start);
    idx.add_lengths(group_end - group_start);
    idx.add_keys(group_key);
    in_group = false;
  };

  if (size >= 2) {
    SC_ASSIGN_OR_RETURN(const char* magic, reader.Read(0, 2));
    if (magic[0] == '\x1f' && magic[1] == '\x8b') {
      return InvalidArgument(src.name() + " is gzip-compressed; tar shards must be plain tar "
                             "(decompress it with `gunzip`, or extract it and run `shardctl pack`)");
    }
  }
  uint64_t off = 0;
  while (off < size) {
    if (size - off < kBlock) {
      return DataLoss(At(src, off) + ": truncated tar header (" + std::to_string(size - off) +
                      " of 512 bytes)");
    }
    SC_ASSIGN_OR_RETURN(const char* h, reader.Read(off, kBlock));
    if (AllZero(h)) break;  // end-of-archive marker

    uint64_t stored_sum = 0;
    if (!ParseNumeric(h + 148, 8, &stored_sum)) {
      return DataLoss(At(src, off) + ": tar header checksum field is not octal (not a tar "
                      "header, or a corrupt one)");
    }
    uint64_t usum = 0;
    int64_t ssum = 0;
    for (uint64_t i = 0; i < kBlock; ++i) {
      const bool in_sum_field = i >= 148 && i < 156;
      usum += in_sum_field ? ' ' : static_cast<unsigned char>(h[i]);
      ssum += in_sum_field ? ' ' : static_cast<signed char>(h[i]);
    }
    if (stored_sum != usum && static_cast<int64_t>(stored_sum) != ssum) {
      return DataLoss(At(src, off) + ": bad tar header checksum (stored " +
                      std::to_string(stored_sum) + ", computed " + std::to_string(usum) + ")");
    }
    uint64_t header_size = 0;
    if (!ParseNumeric(h + 124, 12, &header_size)) {
      return DataLoss(At(src, off) + ": tar header size field is malformed");
    }
    const char type = h[156];
    std::string name;
    if (pax.path) {
      name = *pax.path;
    } else if (pax.long_name) {
      name = *pax.long_name;
    } else {
      name = CString(h, 100);
      // POSIX ustar ("ustar\0") splits long names into prefix/name; GNU's old format
      // ("ustar  \0") uses those bytes for other fields.
      if (std::memcmp(h + 257, "ustar\0", 6) == 0 && h[345] != '\0') {
        name = CString(h + 345, 155) + "/" + name;
      }
    }
    uint64_t data_len = HasNoData(type) ? 0 : header_size;
    if (!IsMetaType(type) && pax.size && !HasNoData(type)) data_len = *pax.size;
    const uint64_t data_off = off + kBlock;
    if (data_len > size - data_off) {
      return DataLoss(At(src, off) + ": member '" + name + "' has " + std::to_string(data_len) +
                      " data bytes but the file ends " + std::to_string(size - data_off) +
                      " bytes after its header (truncated shard?)");
    }
    const uint64_t padded = (data_len + kBlock - 1) / kBlock * kBlock;
    if (padded > size - data_off) {
      return DataLoss(At(src, off) + ": member '" + name +
                      "' lacks the padding to a 512-byte block (truncated shard?)");
    }
    const uint64_t next = data_off + padded;

    if (IsMetaType(type)) {
      if (data_len > kMaxTarMetaBytes) {
        return DataLoss(At(src, off) + ": tar metadata member of type '" + std::string(1, type) +
                        "' claims " + std::to_string(data_len) + " bytes (limit " +
                        std::to_string(kMaxTarMetaBytes) + ")");
      }
      if (type != 'g' && pax.first_meta_offset == UINT64_MAX) pax.first_meta_offset = off;
      if (type == 'x' || type == 'L') {
        std::string data(static_cast<size_t>(data_len), '\0');
        SC_RETURN_IF_ERROR(src.ReadAt(data_off, data.data(), data.size()));
        if (type == 'x') {
          SC_RETURN_IF_ERROR(ParsePaxRecords(data, src, data_off, &pax));
        } else {
          pax.long_name = CString(data.data(), data.size());
        }
      }
      off = next;
      continue;
    }
    if (type == 'S') {
      return InvalidArgument(At(src, off) + ": GNU sparse member '" + name +
                             "' is not supported in tar shards");
    }

    const bool is_file = type == '0' || type == '\0' || type == '7';
    std::string key, ext;
    if (is_file && SplitWebDatasetKey(name, &key, &ext)) {
      if (!IsValidUtf8(name)) {
        return InvalidArgument(At(src, off) + ": member name is not valid UTF-8; sample keys "
                               "are stored as UTF-8 (rename the member, or pack the files "
                               "with `shardctl pack`, which escapes such names)");
      }
      const uint64_t member_start =
          pax.first_meta_offset != UINT64_MAX ? pax.first_meta_offset : off;
      if (!in_group || key != group_key) {
        close_group();
        in_group = true;
        group_key = key;
        group_start = member_start;
      }
      group_end = next;
      if (idx.offsets_size() == INT32_MAX) {
        return InvalidArgument(At(src, off) + ": too many samples in one shard");
      }
      idx.add_member_sample(static_cast<uint32_t>(idx.offsets_size()));
      idx.add_member_offset(data_off);
      idx.add_member_length(data_len);
      idx.add_member_ext(ext);
    }
    pax.Clear();
    off = next;
  }
  close_group();
  return idx;
}

}  // namespace shardcache::dataset
