#include "objstore/object_uri.h"

#include <cctype>

namespace shardcache::objstore {
namespace {

const char kForms[] = " (use s3://BUCKET/PREFIX, https://HOST[:PORT]/PATH or http://HOST[:PORT]/PATH)";

// S3's bucket naming rules, the part a typo breaks: 3-63 characters of lower-case letters,
// digits, '.' and '-', starting and ending with a letter or digit.
bool ValidBucket(const std::string& b) {
  if (b.size() < 3 || b.size() > 63) return false;
  for (char c : b) {
    if (!(std::islower(static_cast<unsigned char>(c)) || std::isdigit(static_cast<unsigned char>(c)) ||
          c == '.' || c == '-')) {
      return false;
    }
  }
  return std::isalnum(static_cast<unsigned char>(b.front())) && std::isalnum(static_cast<unsigned char>(b.back()));
}

// Strips leading and trailing '/' and refuses "." / ".." components and empty ones ("a//b").
Result<std::string> CleanPrefix(std::string p, const std::string& quoted) {
  while (!p.empty() && p.front() == '/') p.erase(0, 1);
  while (!p.empty() && p.back() == '/') p.pop_back();
  size_t start = 0;
  while (!p.empty() && start <= p.size()) {
    size_t end = p.find('/', start);
    if (end == std::string::npos) end = p.size();
    const std::string part = p.substr(start, end - start);
    if (part.empty() || part == "." || part == "..") {
      return InvalidArgument(quoted + " has an empty, '.' or '..' path component" + kForms);
    }
    start = end + 1;
  }
  return p;
}

}  // namespace

std::string ObjectUri::Key(const std::string& relative) const {
  if (prefix.empty()) return relative;
  if (relative.empty()) return prefix;
  return prefix + "/" + relative;
}

std::string ObjectUri::Describe(const std::string& key) const {
  return (is_s3() ? "s3://" + bucket : origin) + "/" + key;
}

Result<ObjectUri> ParseObjectUri(const std::string& uri) {
  const std::string quoted = "'" + uri + "'";
  ObjectUri u;
  std::string rest;
  auto starts = [&](const char* p) { return uri.rfind(p, 0) == 0; };
  if (starts("s3://")) {
    u.scheme = ObjectUri::Scheme::kS3;
    rest = uri.substr(5);
  } else if (starts("https://")) {
    u.scheme = ObjectUri::Scheme::kHttps;
    rest = uri.substr(8);
  } else if (starts("http://")) {
    u.scheme = ObjectUri::Scheme::kHttp;
    rest = uri.substr(7);
  } else {
    return InvalidArgument(quoted + " is not an object-storage URI" + kForms);
  }
  if (rest.find_first_of("?#") != std::string::npos) {
    return InvalidArgument(quoted + " must not carry a query or fragment" + kForms);
  }
  const size_t slash = rest.find('/');
  const std::string authority = rest.substr(0, slash);
  SC_ASSIGN_OR_RETURN(u.prefix, CleanPrefix(slash == std::string::npos ? "" : rest.substr(slash), quoted));
  if (u.is_s3()) {
    if (!ValidBucket(authority)) {
      return InvalidArgument(quoted + ": '" + authority +
                             "' is not a valid bucket name (3-63 characters of a-z, 0-9, '.' and '-')" + kForms);
    }
    u.bucket = authority;
    return u;
  }
  if (authority.empty() || authority.find('@') != std::string::npos) {
    return InvalidArgument(quoted + " needs a host (and no user@) after the scheme" + kForms);
  }
  u.origin = uri.substr(0, uri.find("://") + 3) + authority;
  return u;
}

}  // namespace shardcache::objstore
