// ObjectClient: reads and writes the objects of one store location (an ObjectUri: an S3 bucket,
// or an http(s):// host) over HTTP with libcurl. Stat, ranged reads (one, or a batch run
// concurrently), List and Put. The upstream's ChunkSource and shardctl build on it.
//
//   s3://BUCKET/...  S3 REST API: HEAD, GET with Range, ListObjectsV2, PUT; signed by libcurl
//                    (SigV4, "aws:amz:REGION:s3") when credentials resolve (options.h),
//                    addressed path-style or virtual-host style (options.h).
//   https://HOST/... plain HTTP(S): HEAD, GET with Range. List and Put are Unimplemented.
//
// Keys are full keys below the bucket (s3) or the host (http/https); uri().Key(relative) adds
// the URI's prefix. Every request runs on one CurlDriver thread with at most
// options.max_connections connections at once; many ranged GETs in flight need no more threads.
// Integrity and failure handling (retries, resume, ETag / size checks, named errors) are
// Exchange's (exchange.h) and errors.h's: every failure names the endpoint, bucket and object.
//
// Thread safety: all methods may be called from any thread at once. Completions of ReadRangeAsync
// run on the driver thread and must not block (nor call the blocking methods: they would wait
// for the thread they block). Destroying the client cancels what is in flight
// (completions get Cancelled) and joins the driver thread.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/fs.h"
#include "common/status.h"
#include "objstore/curl_driver.h"
#include "objstore/exchange.h"
#include "objstore/object_uri.h"
#include "objstore/options.h"
#include "objstore/s3_xml.h"

namespace shardcache::objstore {

struct ObjectStat {
  uint64_t size = 0;
  std::string etag;  // as the server quotes it; "" when it sends none (some http servers)
};

struct ObjectBytes {
  std::string bytes;
  std::string etag;
};

// One ranged read: bytes [offset, offset + length) of `key`. expected_etag / expected_size are
// the object's as indexed ("" / kUnknownSize: not checked, but pinned to the first response).
// `dest`, when set, receives the bytes instead of the result string (which is then empty): the
// caller's buffer of `length` bytes, valid until the read completes — a failed read may leave
// part of it written.
struct RangeRead {
  std::string key;
  uint64_t offset = 0;
  uint64_t length = 0;
  std::string expected_etag;
  uint64_t expected_size = kUnknownSize;
  uint8_t* dest = nullptr;
  bool urgent = false;  // a demand read: begins before queued reads that are not
};

class ObjectClient {
 public:
  // InvalidArgument for bad options or credentials (options.h); Internal when curl fails to start.
  static Result<std::unique_ptr<ObjectClient>> Open(const ObjectUri& uri, const ObjectStoreOptions& options);
  ~ObjectClient();

  const ObjectUri& uri() const { return uri_; }
  // "http://127.0.0.1:4568": the endpoint requests go to, as messages name it.
  const std::string& endpoint() const { return endpoint_; }

  // Size and ETag of `key` (HEAD). NotFound names a missing object or bucket.
  Result<ObjectStat> Stat(const std::string& key);
  // Stat of every key, the HEADs run concurrently; result i belongs to keys[i]. (A missing
  // bucket is not told from a missing object here: NotFound names the object.)
  std::vector<Result<ObjectStat>> StatMany(const std::vector<std::string>& keys);
  // The whole object with its ETag (one GET; small objects: manifests, sample indexes).
  Result<ObjectBytes> Get(const std::string& key);
  // Exactly `length` bytes at `offset` (empty for length 0), or a named error; see RangeRead.
  Result<std::string> ReadRange(const std::string& key, uint64_t offset, uint64_t length,
                                const std::string& expected_etag = "", uint64_t expected_size = kUnknownSize);
  // The reads of `ranges` run concurrently; result i belongs to ranges[i].
  std::vector<Result<std::string>> ReadRanges(const std::vector<RangeRead>& ranges);
  // Asynchronous form: `done` runs once on the driver thread.
  void ReadRangeAsync(const RangeRead& range, std::function<void(Result<std::string>)> done);
  // Every object whose key starts with `prefix` (ListObjectsV2, following continuation tokens),
  // in the store's (lexicographic) order. Unimplemented for http(s):// stores.
  Result<std::vector<ObjectInfo>> List(const std::string& prefix);
  // Ends every request in flight or waiting for a retry with Cancelled, and makes later ones
  // fail at once with Cancelled (the daemon is stopping). Idempotent.
  void Shutdown();
  // Stores `bytes` as `key` in one PUT; returns its ETag. Unimplemented for http(s):// stores.
  Result<std::string> Put(const std::string& key, const std::string& bytes);
  // Stores the file at `path` as `key` and returns its ETag: one PUT when it is at most
  // `part_bytes`, else a multipart upload (multipart_upload.cc) of parts of `part_bytes` (more
  // when the file would need over S3's 10000 parts), one part in memory at a time — a shard of
  // many GiB needs neither that much memory nor fits S3's 5 GiB limit on one PUT. A failed
  // upload is aborted (the store drops its parts) and its error names the object and the part.
  // InvalidArgument for part_bytes under S3's 5 MiB minimum.
  // Removes `key` (DELETE; S3 answers success for a key that does not exist). Unimplemented for
  // http(s):// stores.
  Status Delete(const std::string& key);
  static constexpr uint64_t kPartBytes = uint64_t{64} << 20;
  static constexpr uint64_t kMinPartBytes = uint64_t{5} << 20;
  Result<std::string> PutFile(const std::string& key, const std::string& path, uint64_t part_bytes = kPartBytes);

 private:
  ObjectClient(ObjectUri uri, std::string endpoint, bool virtual_host, RequestPolicy policy, std::string key_id,
               uint32_t list_page_keys, std::unique_ptr<CurlDriver> driver);

  // URL of `key` (already relative to the bucket / host), each path segment percent-encoded.
  std::string ObjectUrl(const std::string& key) const;
  // URL of the bucket itself with a query (already canonical: sorted, encoded).
  std::string BucketUrl(const std::string& query) const;
  ErrorContext Context(const std::string& key) const;
  HttpRequest HeadRequest(const std::string& key) const;
  Result<ListPage> ListPageAt(const std::string& prefix, const std::string& token);
  // The steps of a multipart upload (multipart_upload.cc). `query` is already canonical.
  Result<HttpResponse> Send(const std::string& op, const std::string& method, const std::string& key,
                            const std::string& query, std::string body);
  Result<std::string> UploadParts(const std::string& key, const UniqueFd& fd, const std::string& path, uint64_t size,
                                  uint64_t part_bytes, const std::string& upload);  // upload: "uploadId=..."
  Status ProbeBucket();

  const ObjectUri uri_;
  const std::string endpoint_;
  const bool virtual_host_;
  const RequestPolicy policy_;
  const std::string access_key_id_;
  const uint32_t list_page_keys_;
  std::unique_ptr<CurlDriver> driver_;
};

// Percent-encodes everything but RFC 3986's unreserved characters, and '/' when keep_slash:
// the encoding SigV4's canonical request expects (so the URL curl signs is canonical as is).
std::string UriEncode(const std::string& s, bool keep_slash);

}  // namespace shardcache::objstore
