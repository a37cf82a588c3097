#include "objstore/exchange.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <cstring>
#include <future>
#include <map>
#include <random>

#include <spdlog/spdlog.h>

#include "common/log.h"
#include "objstore/objstore_metrics.h"
#include "objstore/s3_xml.h"

namespace shardcache::objstore {
namespace {

// Error bodies are small XML documents; more than this is not an S3 error worth reading.
constexpr size_t kMaxErrorBody = 64 * 1024;
// SHA-256 of the empty payload: what a bodiless signed request declares in x-amz-content-sha256.
constexpr char kEmptySha256[] = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

struct CurlEasyDeleter {
  void operator()(CURL* c) const { curl_easy_cleanup(c); }
};
struct SlistDeleter {
  void operator()(curl_slist* l) const { curl_slist_free_all(l); }
};

std::string Lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// "bytes START-END/TOTAL" → start, end and total; false when malformed ("*" totals included).
bool ParseContentRange(const std::string& v, uint64_t* start, uint64_t* end, uint64_t* total) {
  if (v.rfind("bytes ", 0) != 0) return false;
  char* p = nullptr;
  *start = std::strtoull(v.c_str() + 6, &p, 10);
  if (*p != '-') return false;
  *end = std::strtoull(p + 1, &p, 10);
  if (*p != '/' || p[1] == '*' || p[1] == '\0') return false;
  *total = std::strtoull(p + 1, &p, 10);
  return *p == '\0';
}

std::string CurlText(CURLcode code, const char* detail) {
  std::string t = curl_easy_strerror(code);
  if (detail && *detail) t += std::string(" (") + detail + ")";
  return t;
}

// Transport failures that no retry fixes: a bad URL, TLS verification, a feature curl lacks.
bool FatalTransport(CURLcode code) {
  return code == CURLE_URL_MALFORMAT || code == CURLE_UNSUPPORTED_PROTOCOL || code == CURLE_PEER_FAILED_VERIFICATION ||
         code == CURLE_SSL_CACERT_BADFILE || code == CURLE_SSL_CERTPROBLEM || code == CURLE_NOT_BUILT_IN ||
         code == CURLE_FAILED_INIT || code == CURLE_OUT_OF_MEMORY;
}

class Exchange final : public Transfer, public std::enable_shared_from_this<Exchange> {
 public:
  Exchange(CurlDriver* driver, const RequestPolicy& policy, HttpRequest request, HttpCompletion done)
      : driver_(driver), policy_(policy), req_(std::move(request)), done_(std::move(done)) {}

  CURL* Begin() override;
  void Finish(CURLcode result) override;

 private:
  static size_t OnHeader(char* data, size_t size, size_t n, void* self);
  static size_t OnBody(char* data, size_t size, size_t n, void* self);
  static size_t OnRead(char* data, size_t size, size_t n, void* self);

  void SetCommonOptions(CURL* c);
  curl_slist* BuildHeaders() const;
  // Checks a 2xx attempt's headers (status, ETag, Content-Range) and pins ETag and size.
  Status CheckHeaders(long code);
  std::string RangeText() const;
  void FinishHttp(long code);
  void Retry(const Status& why, const char* reason);
  void Complete(Result<HttpResponse> r);

  CurlDriver* const driver_;
  const RequestPolicy policy_;
  HttpRequest req_;
  HttpCompletion done_;
  std::unique_ptr<CURL, CurlEasyDeleter> easy_;
  std::unique_ptr<curl_slist, SlistDeleter> header_list_;
  char curl_error_[CURL_ERROR_SIZE] = {};
  uint32_t attempts_ = 0;
  uint64_t received_ = 0;  // ranged GET: bytes of the range kept so far (resume point)
  std::string data_;       // response body (the range's bytes for a ranged GET)
  // Per attempt:
  std::map<std::string, std::string> headers_;  // lower-case names of the last response
  bool headers_checked_ = false;
  long code_ = 0;
  Status fatal_;            // set by a callback that stopped the transfer
  std::string error_body_;  // body of a non-2xx response
  size_t put_pos_ = 0;
};

std::string Exchange::RangeText() const {
  if (!req_.ranged) return "";
  return " bytes " + std::to_string(req_.offset) + "-" + std::to_string(req_.offset + req_.length - 1) + " (" +
         std::to_string(received_) + " of " + std::to_string(req_.length) + " received)";
}

curl_slist* Exchange::BuildHeaders() const {
  curl_slist* l = nullptr;
  auto add = [&](const std::string& h) { l = curl_slist_append(l, h.c_str()); };
  for (const auto& h : req_.headers) add(h);
  if (req_.ranged) {
    add("Range: bytes=" + std::to_string(req_.offset + received_) + "-" +
        std::to_string(req_.offset + req_.length - 1));
  }
  // A weak ETag (W/"...") never matches If-Match's strong comparison: the arrival check below
  // still compares it.
  if (!req_.expect_etag.empty() && req_.expect_etag.rfind("W/", 0) != 0 &&
      (req_.method == "GET" || req_.method == "HEAD")) {
    add("If-Match: " + req_.expect_etag);
  }
  if (!policy_.sigv4.empty()) {
    bool has_sha = false;
    for (const auto& h : req_.headers) has_sha = has_sha || Lower(h).rfind("x-amz-content-sha256:", 0) == 0;
    if (!has_sha) add(std::string("x-amz-content-sha256: ") + kEmptySha256);
    if (!policy_.session_token.empty()) add("x-amz-security-token: " + policy_.session_token);
  }
  // No "Expect:" line to suppress 100-continue: curl 7.88 signs a header it is told to remove
  // differently from what it sends (the signature then fails); a PUT over 1 MiB pays that RTT.
  return l;
}

void Exchange::SetCommonOptions(CURL* c) {
  curl_easy_setopt(c, CURLOPT_URL, req_.url.c_str());
  curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(c, CURLOPT_ERRORBUFFER, curl_error_);
  // HTTP/1.1: one request per connection at a time, so the connection cap is the parallelism
  // and a slow response never holds up others multiplexed on its connection.
  curl_easy_setopt(c, CURLOPT_HTTP_VERSION, static_cast<long>(CURL_HTTP_VERSION_1_1));
  curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, static_cast<long>(policy_.request_timeout_ms));
  curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(policy_.connect_timeout_ms));
  curl_easy_setopt(c, CURLOPT_LOW_SPEED_LIMIT, 1L);
  curl_easy_setopt(c, CURLOPT_LOW_SPEED_TIME, static_cast<long>(std::max<uint32_t>(1, policy_.stall_timeout_ms / 1000)));
  curl_easy_setopt(c, CURLOPT_TCP_KEEPALIVE, 1L);
  curl_easy_setopt(c, CURLOPT_SSL_VERIFYPEER, policy_.verify_tls ? 1L : 0L);
  curl_easy_setopt(c, CURLOPT_SSL_VERIFYHOST, policy_.verify_tls ? 2L : 0L);
  if (!policy_.ca_file.empty()) curl_easy_setopt(c, CURLOPT_CAINFO, policy_.ca_file.c_str());
  if (!policy_.sigv4.empty()) {
    curl_easy_setopt(c, CURLOPT_AWS_SIGV4, policy_.sigv4.c_str());
    curl_easy_setopt(c, CURLOPT_USERPWD, policy_.userpwd.c_str());
  }
  curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, &Exchange::OnHeader);
  curl_easy_setopt(c, CURLOPT_HEADERDATA, this);
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, &Exchange::OnBody);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, this);
}

CURL* Exchange::Begin() {
  if (!easy_) easy_.reset(curl_easy_init());
  if (!easy_) return nullptr;
  CURL* c = easy_.get();
  curl_easy_reset(c);
  ++attempts_;
  headers_.clear();
  headers_checked_ = false;
  code_ = 0;
  fatal_ = Status::Ok();
  error_body_.clear();
  put_pos_ = 0;
  curl_error_[0] = '\0';
  if (!req_.ranged) data_.clear();
  // One allocation for the whole range, not a doubling string.
  if (req_.ranged && req_.dest == nullptr) data_.reserve(req_.length);
  SetCommonOptions(c);
  if (req_.method == "HEAD") {
    curl_easy_setopt(c, CURLOPT_NOBODY, 1L);
  } else if (req_.method == "PUT") {
    curl_easy_setopt(c, CURLOPT_UPLOAD, 1L);
    curl_easy_setopt(c, CURLOPT_READFUNCTION, &Exchange::OnRead);
    curl_easy_setopt(c, CURLOPT_READDATA, this);
    curl_easy_setopt(c, CURLOPT_INFILESIZE_LARGE, static_cast<curl_off_t>(req_.body.size()));
  } else if (req_.method == "POST") {
    curl_easy_setopt(c, CURLOPT_POST, 1L);
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, req_.body.data());
    curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(req_.body.size()));
  } else if (req_.method == "DELETE") {
    curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, "DELETE");
  }
  header_list_.reset(BuildHeaders());
  curl_easy_setopt(c, CURLOPT_HTTPHEADER, header_list_.get());
  RequestsCounter(req_.op)->Add();
  return c;
}

size_t Exchange::OnHeader(char* data, size_t size, size_t n, void* self_ptr) {
  auto* self = static_cast<Exchange*>(self_ptr);
  const std::string line(data, size * n);
  if (line.rfind("HTTP/", 0) == 0) {
    self->headers_.clear();  // a new response (after 100 Continue or a redirect)
  } else if (const size_t colon = line.find(':'); colon != std::string::npos) {
    std::string value = line.substr(colon + 1);
    const size_t b = value.find_first_not_of(" \t");
    const size_t e = value.find_last_not_of(" \t\r\n");
    value = b == std::string::npos ? "" : value.substr(b, e - b + 1);
    self->headers_[Lower(line.substr(0, colon))] = value;
  }
  return size * n;
}

size_t Exchange::OnBody(char* data, size_t size, size_t n, void* self_ptr) {
  auto* self = static_cast<Exchange*>(self_ptr);
  const size_t bytes = size * n;
  if (!self->headers_checked_) {
    self->headers_checked_ = true;
    curl_easy_getinfo(self->easy_.get(), CURLINFO_RESPONSE_CODE, &self->code_);
    if (self->code_ >= 200 && self->code_ < 300) {
      self->fatal_ = self->CheckHeaders(self->code_);
      if (!self->fatal_.ok()) return 0;  // stops the transfer: CURLE_WRITE_ERROR
    }
  }
  if (self->code_ < 200 || self->code_ >= 300) {
    if (self->error_body_.size() < kMaxErrorBody) self->error_body_.append(data, bytes);
    return bytes;
  }
  if (self->req_.ranged) {
    if (self->received_ + bytes > self->req_.length) {
      self->fatal_ = Internal("server sent more than the requested range of " + self->req_.ctx.object);
      return 0;
    }
    if (self->req_.dest != nullptr) std::memcpy(self->req_.dest + self->received_, data, bytes);
    self->received_ += bytes;
    ReadBytesCounter()->Add(bytes);
    if (self->req_.dest != nullptr) return bytes;
  }
  self->data_.append(data, bytes);
  return bytes;
}

size_t Exchange::OnRead(char* data, size_t size, size_t n, void* self_ptr) {
  auto* self = static_cast<Exchange*>(self_ptr);
  const size_t k = std::min(size * n, self->req_.body.size() - self->put_pos_);
  std::copy_n(self->req_.body.data() + self->put_pos_, k, data);
  self->put_pos_ += k;
  return k;
}

Status Exchange::CheckHeaders(long code) {
  const std::string etag = headers_.count("etag") ? headers_["etag"] : "";
  uint64_t total = kUnknownSize;
  if (req_.ranged) {
    uint64_t start = 0, end = 0;
    if (code != 206 || !ParseContentRange(headers_["content-range"], &start, &end, &total)) {
      return Internal(req_.ctx.endpoint + " answered a ranged GET of " + req_.ctx.object + " with HTTP " +
                      std::to_string(code) + " and Content-Range '" + headers_["content-range"] +
                      "' (a server that ignores Range cannot be read)");
    }
    if (start != req_.offset + received_) {
      return Internal(req_.ctx.endpoint + " sent " + req_.ctx.object + " from byte " + std::to_string(start) +
                      ", not the " + std::to_string(req_.offset + received_) + " asked for");
    }
    if (end != req_.offset + req_.length - 1 && req_.expect_size == kUnknownSize) {
      // The server cut the range at the object's end (a size check, when the size is known,
      // names the changed object below instead).
      return OutOfRange("bytes " + std::to_string(req_.offset) + "-" + std::to_string(req_.offset + req_.length - 1) +
                        " reach past the end of " + req_.ctx.object + " (" + std::to_string(total) + " bytes)");
    }
  } else if (headers_.count("content-length")) {
    total = std::strtoull(headers_["content-length"].c_str(), nullptr, 10);
  }
  const bool etag_differs = !req_.expect_etag.empty() && !etag.empty() && etag != req_.expect_etag;
  const bool size_differs = req_.expect_size != kUnknownSize && total != kUnknownSize && total != req_.expect_size;
  if (etag_differs || size_differs) {
    return ObjectChanged(req_.ctx.object, req_.expect_etag, etag, req_.expect_size, total);
  }
  // Pinned: a resumed attempt must find the same version of the object.
  if (req_.expect_etag.empty()) req_.expect_etag = etag;
  if (req_.expect_size == kUnknownSize) req_.expect_size = total;
  return Status::Ok();
}

void Exchange::Finish(CURLcode result) {
  if (result == CURLE_ABORTED_BY_CALLBACK && driver_->stopping()) {
    return Complete(Cancelled("object store client stopped before " + req_.ctx.object + RangeText() + " finished"));
  }
  if (!fatal_.ok()) return Complete(fatal_);
  if (result != CURLE_OK) {
    const Status s = Unavailable("connection to " + req_.ctx.endpoint + " failed during " + req_.method + " " +
                                 (req_.ctx.object.empty() ? "bucket " + req_.ctx.bucket : req_.ctx.object) +
                                 RangeText() + ": " + CurlText(result, curl_error_));
    if (FatalTransport(result)) {
      const bool tls = result == CURLE_PEER_FAILED_VERIFICATION || result == CURLE_SSL_CACERT_BADFILE ||
                       result == CURLE_SSL_CERTPROBLEM;
      return Complete(FailedPrecondition(s.message() + (tls ? " (check the CA bundle: objstore.ca)" : "")));
    }
    return Retry(s, "dropped");
  }
  long code = 0;
  curl_easy_getinfo(easy_.get(), CURLINFO_RESPONSE_CODE, &code);
  FinishHttp(code);
}

void Exchange::FinishHttp(long code) {
  code_ = code;
  if (code >= 200 && code < 300) {
    if (!headers_checked_) {
      headers_checked_ = true;
      if (Status s = CheckHeaders(code); !s.ok()) return Complete(s);
    }
    if (req_.ranged && received_ < req_.length) {
      return Retry(Unavailable("connection to " + req_.ctx.endpoint + " ended early during GET " + req_.ctx.object +
                               RangeText()),
                   "dropped");
    }
    HttpResponse r;
    r.http_code = code;
    r.etag = headers_.count("etag") ? headers_["etag"] : req_.expect_etag;
    r.object_size = req_.expect_size;
    r.body = std::move(data_);
    r.attempts = attempts_;
    if (req_.method == "PUT") WrittenBytesCounter()->Add(req_.body.size());
    return Complete(std::move(r));
  }
  if (code == 412) {
    return Complete(ObjectChanged(req_.ctx.object, req_.expect_etag, headers_.count("etag") ? headers_["etag"] : "",
                                  0, 0));
  }
  const Status s = HttpError(req_.ctx, code, error_body_);
  const S3Error e = ParseS3Error(error_body_);
  if (!RetryableHttp(code, e.code)) return Complete(s);
  Retry(s, (code == 503 && (e.code == "SlowDown" || e.code.empty())) || code == 429 ? "throttled" : "server");
}

void Exchange::Retry(const Status& why, const char* reason) {
  if (attempts_ >= policy_.max_attempts) {
    return Complete(Unavailable(why.message() + "; gave up after " + std::to_string(attempts_) + " attempts"));
  }
  RetriesCounter(reason)->Add();
  // Full jitter (a uniform draw below the exponential cap) keeps many clients throttled at once
  // from retrying in step.
  const uint64_t cap = std::min<uint64_t>(policy_.backoff_max_ms,
                                          uint64_t{policy_.backoff_initial_ms} << std::min<uint32_t>(attempts_ - 1, 20));
  thread_local std::mt19937_64 rng{std::random_device{}()};
  const uint64_t delay_ms = cap == 0 ? 0 : std::uniform_int_distribution<uint64_t>(0, cap)(rng);
  static RateLimiter limiter(5);
  uint64_t suppressed = 0;
  if (limiter.Allow(&suppressed)) {
    spdlog::warn("objstore: retrying in {} ms (attempt {} of {}): {} [{} similar suppressed]", delay_ms,
                 attempts_ + 1, policy_.max_attempts, why.message(), suppressed);
  }
  if (!driver_->Submit(shared_from_this(), CurlDriver::Clock::now() + std::chrono::milliseconds(delay_ms), req_.urgent)) {
    Complete(Cancelled("object store client stopped while retrying " + req_.ctx.object));
  }
}

void Exchange::Complete(Result<HttpResponse> r) {
  if (!r.ok()) CountError(r.status());
  HttpCompletion done = std::move(done_);
  done_ = nullptr;
  if (done) done(std::move(r));
}

}  // namespace

void RunExchange(CurlDriver* driver, const RequestPolicy& policy, HttpRequest request, HttpCompletion done) {
  const bool urgent = request.urgent;
  auto ex = std::make_shared<Exchange>(driver, policy, std::move(request), std::move(done));
  if (!driver->Submit(ex, {}, urgent)) ex->Finish(CURLE_ABORTED_BY_CALLBACK);
}

Result<HttpResponse> RunExchangeSync(CurlDriver* driver, const RequestPolicy& policy, HttpRequest request) {
  std::promise<Result<HttpResponse>> p;
  auto f = p.get_future();
  RunExchange(driver, policy, std::move(request), [&p](Result<HttpResponse> r) { p.set_value(std::move(r)); });
  return f.get();
}

}  // namespace shardcache::objstore
