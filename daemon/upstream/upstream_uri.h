// UpstreamUri: where a daemon (or `shardctl warm`) gets its data from, as written in
// `upstream = "..."`: "file:///abs/dir", "grpc://host:port" or "grpcs://host:port" (TLS), or
// object storage: "s3://bucket/prefix", "https://host/path" (and "http://", objstore/). The
// one parser of that syntax: config/ validates the key with it, the daemon and shardctl build
// their source from its result.
//
// Thread safety: plain values and pure functions.
#pragma once

#include <string>

#include "common/status.h"

namespace shardcache::upstream {

struct UpstreamUri {
  enum class Scheme { kFile, kGrpc, kGrpcs, kObject };
  Scheme scheme = Scheme::kFile;
  std::string path;    // kFile: absolute directory, no trailing slash (except "/")
  std::string target;  // kGrpc/kGrpcs: "host:port" as written
  std::string object;  // kObject: the URI as written (objstore::ParseObjectUri accepts it)
  bool tls() const { return scheme == Scheme::kGrpcs; }
};

// InvalidArgument quoting `uri` and listing the accepted forms on anything else.
Result<UpstreamUri> ParseUpstreamUri(const std::string& uri);

}  // namespace shardcache::upstream
