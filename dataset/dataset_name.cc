#include "dataset/dataset_name.h"

#include "dataset/utf8.h"

namespace shardcache::dataset {

namespace {

Status Bad(std::string_view name, const std::string& problem) {
  return InvalidArgument("dataset name '" + std::string(name) + "' " + problem);
}

}  // namespace

Status CheckDatasetName(std::string_view name) {
  if (name.empty()) return Bad(name, "is empty");
  if (name.size() > kMaxDatasetNameBytes) {
    return InvalidArgument("dataset name '" + std::string(name.substr(0, 64)) + "...' (" +
                           std::to_string(name.size()) + " bytes) is longer than " +
                           std::to_string(kMaxDatasetNameBytes) + " bytes");
  }
  if (!IsValidUtf8(name)) return Bad(name, "is not valid UTF-8");
  for (unsigned char c : name) {
    if (c == '\\') return Bad(name, "contains a backslash");
    if (c < 0x20 || c == 0x7f) return Bad(name, "contains a control character (byte " + std::to_string(c) + ")");
  }
  if (name.front() == '/') return Bad(name, "starts with '/' (names are relative to the upstream root)");
  if (name.back() == '/') return Bad(name, "ends with '/'");
  size_t components = 0;
  for (size_t start = 0; start <= name.size();) {
    size_t end = name.find('/', start);
    if (end == std::string_view::npos) end = name.size();
    const std::string_view part = name.substr(start, end - start);
    if (part.empty()) return Bad(name, "contains '//'");
    if (part.front() == '.') {
      return Bad(name, "has a component starting with '.' ('" + std::string(part) +
                           "'; '.', '..' and hidden directories are not datasets)");
    }
    if (part.size() > kMaxDatasetNameComponentBytes) {
      return Bad(name, "has a component longer than " + std::to_string(kMaxDatasetNameComponentBytes) +
                           " bytes");
    }
    if (++components > kMaxDatasetNameComponents) {
      return Bad(name, "has more than " + std::to_string(kMaxDatasetNameComponents) + " components");
    }
    start = end + 1;
  }
  return Status::Ok();
}

bool NameIsTailOf(std::string_view tail, std::string_view path) {
  while (path.size() > 1 && path.back() == '/') path.remove_suffix(1);
  if (tail.empty() || tail.size() > path.size()) return false;
  if (path.substr(path.size() - tail.size()) != tail) return false;
  return tail.size() == path.size() || path[path.size() - tail.size() - 1] == '/';
}

}  // namespace shardcache::dataset
