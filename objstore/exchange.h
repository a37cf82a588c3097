// Exchange: one logical HTTP request to an object store, carried through as many attempts as it
// takes — the unit CurlDriver runs. It owns the retry policy and the integrity checks:
//   - retries with exponential backoff and full jitter on throttling (503 SlowDown, 429), other
//     5xx and dropped connections / timeouts, up to RequestPolicy::max_attempts in all; never on
//     other 4xx;
//   - a ranged GET whose connection drops mid-body resumes at the first byte not yet received
//     (Range: bytes=START+RECEIVED-END), never from zero;
//   - every ranged response must carry the ETag and object size the read expects (the caller's,
//     or those of its first response, so a resumed read never mixes two versions of an object):
//     If-Match asks the server to refuse a changed object (412), and the ETag and the
//     Content-Range total are checked on arrival as well, for servers that ignore If-Match. A
//     mismatch stops the transfer before any byte is kept: FailedPrecondition (errors.h).
// Requests are signed by libcurl (CURLOPT_AWS_SIGV4) when the policy holds credentials.
//
// Thread safety: Run may be called from any thread; the completion runs once, on the driver's
// thread (or the caller's, when the driver is stopping), and must not block.
#pragma once

#include <curl/curl.h>

#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "objstore/curl_driver.h"
#include "objstore/errors.h"

namespace shardcache::objstore {

// How every request of one client is sent (built once from ObjectStoreOptions).
struct RequestPolicy {
  std::string sigv4;          // "aws:amz:REGION:s3"; "" = unsigned
  std::string userpwd;        // "KEY:SECRET" when signed (never logged)
  std::string session_token;  // sent as x-amz-security-token when set
  std::string ca_file;
  bool verify_tls = true;
  uint32_t request_timeout_ms = 60000;
  uint32_t stall_timeout_ms = 15000;
  uint32_t connect_timeout_ms = 10000;
  uint32_t max_attempts = 6;
  uint32_t backoff_initial_ms = 100;
  uint32_t backoff_max_ms = 5000;
};

constexpr uint64_t kUnknownSize = std::numeric_limits<uint64_t>::max();

struct HttpRequest {
  std::string op;      // metrics label: get | head | list | put | multipart
  std::string method;  // GET | HEAD | PUT | POST | DELETE
  std::string url;
  std::vector<std::string> headers;  // extra "Name: value" lines
  std::string body;                  // PUT / POST payload
  // Ranged GET: bytes [offset, offset + length) of an object; length > 0.
  bool ranged = false;
  uint64_t offset = 0;
  uint64_t length = 0;
  // Ranged GET only: where the range's bytes go (length bytes, owned by the caller, valid until
  // the completion runs); null = into HttpResponse::body.
  uint8_t* dest = nullptr;
  std::string expect_etag;               // "" = take the first response's
  uint64_t expect_size = kUnknownSize;   // the whole object's size
  ErrorContext ctx;
  bool urgent = false;  // begins before queued requests that are not (CurlDriver::Submit)
};

struct HttpResponse {
  long http_code = 0;
  std::string etag;
  uint64_t object_size = kUnknownSize;  // Content-Range total, else Content-Length (non-ranged)
  std::string body;
  uint32_t attempts = 0;
};

using HttpCompletion = std::function<void(Result<HttpResponse>)>;

// Starts `request` on `driver`; `done` gets the response (2xx) or a named error.
void RunExchange(CurlDriver* driver, const RequestPolicy& policy, HttpRequest request, HttpCompletion done);

// Blocking form: runs the request and waits for it.
Result<HttpResponse> RunExchangeSync(CurlDriver* driver, const RequestPolicy& policy, HttpRequest request);

}  // namespace shardcache::objstore
