#include "dataset/megatron_format.h"

#include <cstring>

#include "dataset/manifest.h"

namespace shardcache::dataset {

uint32_t MegatronDtypeBytes(uint8_t code) {
  switch (code) {
    case 1: return 1;  // uint8
    case 2: return 1;  // int8
    case 3: return 2;  // int16
    case 4: return 4;  // int32
    case 5: return 8;  // int64
    case 6: return 8;  // float64
    case 7: return 4;  // float32
    case 8: return 2;  // uint16
    default: return 0;
  }
}

const char* MegatronDtypeName(uint8_t code) {
  switch (code) {
    case 1: return "uint8";
    case 2: return "int8";
    case 3: return "int16";
    case 4: return "int32";
    case 5: return "int64";
    case 6: return "float64";
    case 7: return "float32";
    case 8: return "uint16";
    default: return "";
  }
}

const char* MegatronTokenDtype(const v1::Manifest& m) {
  if (m.format() != v1::MEGATRON) return "";
  if (m.megatron_dtype() != 0) return MegatronDtypeName(static_cast<uint8_t>(m.megatron_dtype()));
  switch (m.megatron_dtype_bytes()) {
    case 1: return "uint8";
    case 2: return "uint16";
    case 4: return "int32";
    case 8: return "int64";
    default: return "";
  }
}

namespace {

template <typename T>
T LoadLe(const char* p) {
  // Megatron writes native little-endian numpy arrays; this machine is little-endian too.
  static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__);
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

std::string At(const std::string& name, uint64_t offset) {
  return name + " at offset " + std::to_string(offset);
}

}  // namespace

Result<MegatronIndex> ParseMegatronIndex(std::string_view b, const std::string& idx_name,
                                         uint64_t bin_bytes, const std::string& bin_name) {
  if (b.size() < kMegatronHeaderBytes) {
    return DataLoss(At(idx_name, b.size()) + ": truncated Megatron index header (" +
                    std::to_string(b.size()) + " of " + std::to_string(kMegatronHeaderBytes) +
                    " bytes)");
  }
  if (std::memcmp(b.data(), kMegatronMagic, kMegatronMagicBytes) != 0) {
    return DataLoss(At(idx_name, 0) + ": bad magic, not a Megatron MMIDIDX index");
  }
  const uint64_t version = LoadLe<uint64_t>(b.data() + 9);
  if (version != 1) {
    return DataLoss(At(idx_name, 9) + ": unsupported Megatron index version " +
                    std::to_string(version) + " (expected 1)");
  }
  MegatronIndex out;
  out.dtype_code = static_cast<uint8_t>(b[17]);
  out.dtype_bytes = MegatronDtypeBytes(out.dtype_code);
  if (out.dtype_bytes == 0) {
    return DataLoss(At(idx_name, 17) + ": unknown Megatron dtype code " +
                    std::to_string(out.dtype_code));
  }
  const uint64_t n = LoadLe<uint64_t>(b.data() + 18);
  const uint64_t m = LoadLe<uint64_t>(b.data() + 26);
  out.document_count = m;
  // Check the counts against the file size before trusting them with any allocation.
  const uint64_t body = b.size() - kMegatronHeaderBytes;
  if (n > body / 12 || m > (body - n * 12) / 8) {
    return DataLoss(At(idx_name, 18) + ": index claims " + std::to_string(n) + " sequences and " +
                    std::to_string(m) + " documents but has only " + std::to_string(body) +
                    " bytes after its header (truncated .idx?)");
  }
  const uint64_t sizes_at = kMegatronHeaderBytes;
  const uint64_t pointers_at = sizes_at + n * 4;
  const uint64_t docs_at = pointers_at + n * 8;
  const uint64_t end = docs_at + m * 8;
  // Multimodal indexes append one int8 mode per sequence; anything else is corruption.
  if (b.size() != end && b.size() != end + n) {
    return DataLoss(At(idx_name, end) + ": " + std::to_string(b.size() - end) +
                    " unexpected trailing bytes after the document index");
  }
  if (n > static_cast<uint64_t>(INT32_MAX)) {
    return InvalidArgument(idx_name + ": " + std::to_string(n) +
                           " sequences is more than one shard's sample index can hold");
  }
  v1::SampleIndex& idx = out.samples;
  idx.set_format_version(kSampleIndexFormatVersion);
  idx.mutable_offsets()->Reserve(static_cast<int>(n));
  idx.mutable_lengths()->Reserve(static_cast<int>(n));
  for (uint64_t i = 0; i < n; ++i) {
    const int32_t count = LoadLe<int32_t>(b.data() + sizes_at + i * 4);
    const int64_t pointer = LoadLe<int64_t>(b.data() + pointers_at + i * 8);
    if (count < 0) {
      return DataLoss(At(idx_name, sizes_at + i * 4) + ": sequence " + std::to_string(i) +
                      " has negative size " + std::to_string(count));
    }
    const uint64_t length = static_cast<uint64_t>(count) * out.dtype_bytes;
    if (pointer < 0 || static_cast<uint64_t>(pointer) > bin_bytes ||
        length > bin_bytes - static_cast<uint64_t>(pointer)) {
      return DataLoss(At(idx_name, pointers_at + i * 8) + ": sequence " + std::to_string(i) +
                      " (pointer " + std::to_string(pointer) + ", " + std::to_string(length) +
                      " bytes) lies beyond the end of " + bin_name + " (" +
                      std::to_string(bin_bytes) + " bytes); .idx does not match its .bin");
    }
    idx.add_offsets(static_cast<uint64_t>(pointer));
    idx.add_lengths(length);
  }
  // Document boundaries must be non-decreasing sequence numbers ending at n, as Megatron's
  // reader asserts; a mismatch means the .idx was cut or mixed up.
  int64_t prev = 0;
  for (uint64_t j = 0; j < m; ++j) {
    const int64_t d = LoadLe<int64_t>(b.data() + docs_at + j * 8);
    if (d < prev || static_cast<uint64_t>(d) > n) {
      return DataLoss(At(idx_name, docs_at + j * 8) + ": document index entry " +
                      std::to_string(j) + " = " + std::to_string(d) +
                      " is out of order or beyond the " + std::to_string(n) + " sequences");
    }
    prev = d;
  }
  if (m == 0) {
    return DataLoss(At(idx_name, 26) + ": Megatron index has no document index (count 0)");
  }
  if (static_cast<uint64_t>(prev) != n) {
    return DataLoss(At(idx_name, docs_at + (m - 1) * 8) + ": last document index " +
                    std::to_string(prev) + " does not equal the sequence count " +
                    std::to_string(n));
  }
  return out;
}

std::string MakeMegatronIndex(const std::vector<int32_t>& sequence_lengths, uint8_t dtype_code) {
  const uint64_t n = sequence_lengths.size();
  const uint32_t item = MegatronDtypeBytes(dtype_code);
  std::string out;
  out.reserve(kMegatronHeaderBytes + n * 20 + 8);
  auto put = [&out](const auto& v) { out.append(reinterpret_cast<const char*>(&v), sizeof v); };
  out.append(kMegatronMagic, kMegatronMagicBytes);
  put(uint64_t{1});
  put(dtype_code);
  put(n);
  put(uint64_t{n + 1});  // doc_idx = 0, 1, ..., n: one document per sequence
  for (int32_t len : sequence_lengths) put(len);
  int64_t pointer = 0;
  for (int32_t len : sequence_lengths) {
    put(pointer);
    pointer += static_cast<int64_t>(len) * item;
  }
  for (uint64_t d = 0; d <= n; ++d) put(static_cast<int64_t>(d));
  return out;
}

}  // namespace shardcache::dataset
