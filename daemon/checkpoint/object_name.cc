#include "daemon/checkpoint/object_name.h"

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>

#include <cstdio>

#include "common/hash.h"

namespace shardcache::checkpoint {
namespace {

bool IsNameChar(char c) {
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
         c == '-';
}

// Names that reach error messages are printable ASCII only and short: a hostile name is
// neither echoed whole nor with control bytes.
std::string Printable(const std::string& name) {
  constexpr size_t kShown = 80;
  std::string out;
  for (size_t i = 0; i < name.size() && i < kShown; ++i) {
    const char c = name[i];
    out += (c >= 0x20 && c < 0x7f) ? c : '?';
  }
  if (name.size() > kShown) out += "...";
  return out;
}

Status CheckComponent(const std::string& name, const std::string& component) {
  const auto bad = [&](const std::string& what) {
    return InvalidArgument("object name '" + Printable(name) + "': " + what);
  };
  if (component.empty()) return bad("has an empty component (a leading, trailing or doubled '/')");
  if (component[0] == '.') return bad("component '" + Printable(component) + "' starts with '.'");
  if (component.size() > kMaxComponentBytes) {
    return bad("a component has " + std::to_string(component.size()) + " bytes, more than " +
               std::to_string(kMaxComponentBytes));
  }
  for (char c : component) {
    if (!IsNameChar(c)) {
      return bad("component '" + Printable(component) + "' holds a character outside [A-Za-z0-9._-]");
    }
  }
  return Status::Ok();
}

}  // namespace

Status CheckObjectName(const std::string& name) {
  if (name.empty()) return InvalidArgument("empty object name");
  if (name.size() > kMaxObjectNameBytes) {
    return InvalidArgument("object name '" + Printable(name) + "' has " + std::to_string(name.size()) +
                           " bytes, more than " + std::to_string(kMaxObjectNameBytes));
  }
  if (name[0] == '/') return InvalidArgument("object name '" + Printable(name) + "' is absolute (starts with '/')");
  size_t start = 0;
  while (true) {
    const size_t slash = name.find('/', start);
    const size_t end = slash == std::string::npos ? name.size() : slash;
    SC_RETURN_IF_ERROR(CheckComponent(name, name.substr(start, end - start)));
    if (slash == std::string::npos) return Status::Ok();
    start = slash + 1;
  }
}

Status CheckUploadHeader(const v1::UploadHeader& header) {
  SC_RETURN_IF_ERROR(CheckObjectName(header.name()));
  const std::string of = "upload of '" + header.name() + "': ";
  if (header.part_bytes() < kMinPartBytes || header.part_bytes() > kMaxPartBytes) {
    return InvalidArgument(of + "part_bytes " + std::to_string(header.part_bytes()) + " outside [" +
                           std::to_string(kMinPartBytes) + ", " + std::to_string(kMaxPartBytes) + "]");
  }
  if (header.size() > kMaxObjectBytes) {
    return InvalidArgument(of + "size " + std::to_string(header.size()) + " is more than " +
                           std::to_string(kMaxObjectBytes) + " bytes");
  }
  const uint64_t parts = PartCount(header.size(), header.part_bytes());
  if (static_cast<uint64_t>(header.part_hashes_size()) != parts) {
    return InvalidArgument(of + std::to_string(header.part_hashes_size()) + " part hashes, " +
                           std::to_string(header.size()) + " bytes in parts of " +
                           std::to_string(header.part_bytes()) + " need " + std::to_string(parts));
  }
  for (int i = 0; i < header.part_hashes_size(); ++i) {
    if (header.part_hashes(i).size() != kPartHashBytes) {
      return InvalidArgument(of + "hash of part " + std::to_string(i) + " has " +
                             std::to_string(header.part_hashes(i).size()) + " bytes, not " +
                             std::to_string(kPartHashBytes));
    }
  }
  return Status::Ok();
}

Status CheckUploadId(const std::string& upload_id) {
  bool ok = upload_id.size() == kUploadIdChars;
  for (char c : upload_id) ok = ok && ((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'));
  if (!ok) return InvalidArgument("upload_id is not " + std::to_string(kUploadIdChars) + " lowercase hex digits");
  return Status::Ok();
}

std::string UploadId(const v1::UploadHeader& header) {
  v1::UploadHeader known = header;
  known.DiscardUnknownFields();
  std::string bytes;
  {
    google::protobuf::io::StringOutputStream stream(&bytes);
    google::protobuf::io::CodedOutputStream coded(&stream);
    coded.SetSerializationDeterministic(true);
    known.SerializeToCodedStream(&coded);
  }
  char id[kUploadIdChars + 1];
  std::snprintf(id, sizeof id, "%016llx", static_cast<unsigned long long>(HashBytes64(bytes.data(), bytes.size())));
  return std::string(id, kUploadIdChars);
}

std::string PartHashBytes(const void* data, size_t size) { return HashBytes(data, size).ToBytes(); }

std::string PartHashHex(const std::string& hash) { return Hash128::FromBytes(hash).ToHex(); }

}  // namespace shardcache::checkpoint
