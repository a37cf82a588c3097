#include "daemon/upstream/upstream_uri.h"

#include "common/host_port.h"
#include "objstore/object_uri.h"

namespace shardcache::upstream {

Result<UpstreamUri> ParseUpstreamUri(const std::string& uri) {
  const std::string kForms =
      " (use file:///ABSOLUTE/DIR, grpc://HOST:PORT, grpcs://HOST:PORT, s3://BUCKET/PREFIX or https://HOST/PATH)";
  const std::string quoted = "'" + uri + "'";
  UpstreamUri u;
  auto starts = [&](const char* p) { return uri.rfind(p, 0) == 0; };
  if (starts("file://")) {
    u.scheme = UpstreamUri::Scheme::kFile;
    u.path = uri.substr(7);
    if (u.path.empty() || u.path.front() != '/') {
      return InvalidArgument(quoted + " needs an absolute path after file://" + kForms);
    }
    while (u.path.size() > 1 && u.path.back() == '/') u.path.pop_back();
    return u;
  }
  if (starts("s3://") || starts("https://") || starts("http://")) {
    if (auto o = objstore::ParseObjectUri(uri); !o.ok()) return o.status();
    u.scheme = UpstreamUri::Scheme::kObject;
    u.object = uri;
    return u;
  }
  std::string rest;
  if (starts("grpc://")) {
    u.scheme = UpstreamUri::Scheme::kGrpc;
    rest = uri.substr(7);
  } else if (starts("grpcs://")) {
    u.scheme = UpstreamUri::Scheme::kGrpcs;
    rest = uri.substr(8);
  } else {
    return InvalidArgument(quoted + " is not a supported upstream" + kForms);
  }
  if (!rest.empty() && rest.back() == '/') rest.pop_back();
  if (rest.find('/') != std::string::npos) {
    return InvalidArgument(quoted + " must not have a path after host:port" + kForms);
  }
  if (Status s = CheckHostPort(rest); !s.ok()) return InvalidArgument(s.message() + kForms);
  u.target = rest;
  return u;
}

}  // namespace shardcache::upstream
