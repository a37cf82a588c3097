// ObjectUri: where objects live, as written in an upstream or a shardctl argument:
//   "s3://BUCKET/PREFIX"      a bucket (and a key prefix) of an S3-protocol store; the endpoint,
//                             region and addressing come from ObjectStoreOptions
//   "https://HOST[:PORT]/PATH" plain HTTPS: objects are files below PATH, read with ranged GETs
//   "http://HOST[:PORT]/PATH"  the same without TLS (loopback tests, trusted networks)
// The one parser of that syntax. Keys handed to ObjectClient are full keys below the bucket (s3)
// or below the host (http/https); Key(relative) joins the prefix and a relative name.
//
// Thread safety: plain values and pure functions.
#pragma once

#include <string>

#include "common/status.h"

namespace shardcache::objstore {

struct ObjectUri {
  enum class Scheme { kS3, kHttps, kHttp };
  Scheme scheme = Scheme::kS3;
  std::string bucket;  // kS3: the bucket name (3-63 chars of [a-z0-9.-])
  std::string origin;  // kHttps/kHttp: "https://host[:port]" (no path, no trailing slash)
  std::string prefix;  // below the bucket / host: no leading or trailing '/', may be empty

  bool is_s3() const { return scheme == Scheme::kS3; }
  // prefix + "/" + relative (or relative alone when the prefix is empty).
  std::string Key(const std::string& relative) const;
  // How messages name an object: "s3://bucket/key" or "https://host/key".
  std::string Describe(const std::string& key) const;
};

// InvalidArgument quoting `uri` and saying what is wrong (scheme, bucket name, host, "..").
Result<ObjectUri> ParseObjectUri(const std::string& uri);

}  // namespace shardcache::objstore
