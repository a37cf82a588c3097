// Named errors of the object store: every failure ObjectClient returns says what went wrong in
// the operator's terms and names the endpoint, bucket and object (never a secret):
//   NotFound           "bucket B does not exist at ENDPOINT" (NoSuchBucket)
//                      "object s3://B/K does not exist at ENDPOINT" (NoSuchKey, 404)
//   PermissionDenied   "credentials refused by ENDPOINT for bucket B (S3 CODE: ...; access key
//                      id AKIA...; check ...)" (InvalidAccessKeyId, SignatureDoesNotMatch,
//                      AccessDenied, 401, 403)
//   FailedPrecondition "object X changed since it was indexed (ETag a → b, size m → n); re-run
//                      shardctl index" (412, or an ETag / Content-Range total that differs)
//   OutOfRange         a range past the end of the object (416, or cut short at its end)
//   Unavailable        throttling (503 SlowDown, 429), 5xx and dropped connections: retryable;
//                      once retries are exhausted the message names the object, the range and
//                      the bytes received
// Retryable and fatal stay distinct: only Unavailable is retried.
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <string>

#include "common/status.h"

namespace shardcache::objstore {

// What a request was about, for messages.
struct ErrorContext {
  std::string endpoint;       // "http://127.0.0.1:4568", "https://host"
  std::string bucket;         // "" for http(s):// stores
  std::string object;         // ObjectUri::Describe(key), "" for bucket-level requests (List)
  std::string access_key_id;  // "" when unsigned
};

// The status for a completed HTTP exchange that did not succeed (code >= 300): S3's <Code> from
// `body` decides where it has one, the HTTP code otherwise.
Status HttpError(const ErrorContext& ctx, long http_code, const std::string& body);

// The object changed between indexing (expected) and now (found); empty values are "unknown".
Status ObjectChanged(const std::string& object, const std::string& expected_etag, const std::string& found_etag,
                     uint64_t expected_size, uint64_t found_size);

// Throttling and server failures worth retrying: 5xx, 429, and S3's SlowDown / InternalError /
// RequestTimeout codes whatever their HTTP code.
bool RetryableHttp(long http_code, const std::string& s3_code);

}  // namespace shardcache::objstore
