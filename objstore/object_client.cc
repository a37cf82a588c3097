#include "objstore/object_client.h"

#include <openssl/evp.h>

#include <cctype>
#include <future>

#include <spdlog/spdlog.h>

#include "objstore/objstore_metrics.h"

namespace shardcache::objstore {
namespace {

std::string Sha256Hex(const std::string& data) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_Digest(data.data(), data.size(), md, &len, EVP_sha256(), nullptr);
  static const char kHex[] = "0123456789abcdef";
  std::string out;
  for (unsigned int i = 0; i < len; ++i) {
    out.push_back(kHex[md[i] >> 4]);
    out.push_back(kHex[md[i] & 15]);
  }
  return out;
}

// "https://host:port" → scheme "https://" and authority "host:port".
void SplitEndpoint(const std::string& endpoint, std::string* scheme, std::string* authority) {
  const size_t p = endpoint.find("://");
  *scheme = endpoint.substr(0, p + 3);
  *authority = endpoint.substr(p + 3);
  while (!authority->empty() && authority->back() == '/') authority->pop_back();
}

bool UseVirtualHost(const ObjectStoreOptions& options, const std::string& endpoint) {
  if (options.addressing != "auto") return options.addressing == "virtual";
  std::string scheme, authority;
  SplitEndpoint(endpoint, &scheme, &authority);
  const std::string host = authority.substr(0, authority.rfind(':') == std::string::npos ? authority.size()
                                                                                         : authority.rfind(':'));
  const std::string aws = ".amazonaws.com";
  return host.size() > aws.size() && host.compare(host.size() - aws.size(), aws.size(), aws) == 0;
}

RequestPolicy MakePolicy(const ObjectStoreOptions& o, const Credentials& c, bool signed_requests) {
  RequestPolicy p;
  if (signed_requests && !c.empty()) {
    p.sigv4 = "aws:amz:" + o.region + ":s3";
    p.userpwd = c.access_key_id + ":" + c.secret_access_key;
    p.session_token = c.session_token;
  }
  p.ca_file = o.ca_file;
  p.verify_tls = o.verify_tls;
  p.request_timeout_ms = o.request_timeout_ms;
  p.stall_timeout_ms = o.stall_timeout_ms;
  p.connect_timeout_ms = o.connect_timeout_ms;
  p.max_attempts = o.max_attempts;
  p.backoff_initial_ms = o.backoff_initial_ms;
  p.backoff_max_ms = o.backoff_max_ms;
  return p;
}

}  // namespace

std::string UriEncode(const std::string& s, bool keep_slash) {
  static const char kHex[] = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~' || (keep_slash && c == '/')) {
      out.push_back(static_cast<char>(c));
    } else {
      out.push_back('%');
      out.push_back(kHex[c >> 4]);
      out.push_back(kHex[c & 15]);
    }
  }
  return out;
}

Result<std::unique_ptr<ObjectClient>> ObjectClient::Open(const ObjectUri& uri, const ObjectStoreOptions& given) {
  const ObjectStoreOptions options = WithEnvironmentDefaults(given);
  SC_RETURN_IF_ERROR(options.Validate());
  Credentials creds;
  if (uri.is_s3()) {
    SC_ASSIGN_OR_RETURN(creds, ResolveCredentials(options));
  }
  std::string endpoint = uri.is_s3() ? options.endpoint : uri.origin;
  if (endpoint.empty()) endpoint = "https://s3." + options.region + ".amazonaws.com";
  while (endpoint.back() == '/') endpoint.pop_back();
  const bool virtual_host = uri.is_s3() && UseVirtualHost(options, endpoint);
  SC_ASSIGN_OR_RETURN(auto driver, CurlDriver::Start(options.max_connections));
  const std::string where = uri.is_s3() ? "s3://" + uri.bucket + "/" + uri.prefix : uri.origin + "/" + uri.prefix;
  spdlog::info("objstore: {} at {} ({}), {}; {}", where, endpoint,
               uri.is_s3() ? (virtual_host ? "virtual-host style" : "path style") : "plain http",
               uri.is_s3() ? creds.ToString() : "unsigned", options.ToString());
  if (!options.verify_tls) spdlog::warn("objstore: TLS verification is off for {}", endpoint);
  return std::unique_ptr<ObjectClient>(new ObjectClient(uri, endpoint, virtual_host,
                                                        MakePolicy(options, creds, uri.is_s3()),
                                                        creds.access_key_id, options.list_page_keys,
                                                        std::move(driver)));
}

ObjectClient::ObjectClient(ObjectUri uri, std::string endpoint, bool virtual_host, RequestPolicy policy,
                           std::string key_id, uint32_t list_page_keys, std::unique_ptr<CurlDriver> driver)
    : uri_(std::move(uri)),
      endpoint_(std::move(endpoint)),
      virtual_host_(virtual_host),
      policy_(std::move(policy)),
      access_key_id_(std::move(key_id)),
      list_page_keys_(list_page_keys),
      driver_(std::move(driver)) {}

ObjectClient::~ObjectClient() { driver_.reset(); }

void ObjectClient::Shutdown() { driver_->Stop(); }

std::string ObjectClient::ObjectUrl(const std::string& key) const {
  if (!uri_.is_s3()) return endpoint_ + "/" + UriEncode(key, true);
  if (!virtual_host_) return endpoint_ + "/" + uri_.bucket + "/" + UriEncode(key, true);
  std::string scheme, authority;
  SplitEndpoint(endpoint_, &scheme, &authority);
  return scheme + uri_.bucket + "." + authority + "/" + UriEncode(key, true);
}

std::string ObjectClient::BucketUrl(const std::string& query) const {
  return ObjectUrl("") + "?" + query;
}

ErrorContext ObjectClient::Context(const std::string& key) const {
  return ErrorContext{endpoint_, uri_.bucket, key.empty() ? "" : uri_.Describe(key), access_key_id_};
}

Status ObjectClient::ProbeBucket() {
  HttpRequest req;
  req.op = "list";
  req.method = "GET";
  req.url = BucketUrl("list-type=2&max-keys=0");
  req.ctx = Context("");
  return RunExchangeSync(driver_.get(), policy_, std::move(req)).status();
}

HttpRequest ObjectClient::HeadRequest(const std::string& key) const {
  HttpRequest req;
  req.op = "head";
  req.method = "HEAD";
  req.url = ObjectUrl(key);
  req.ctx = Context(key);
  return req;
}

std::vector<Result<ObjectStat>> ObjectClient::StatMany(const std::vector<std::string>& keys) {
  std::vector<std::promise<Result<ObjectStat>>> promises(keys.size());
  std::vector<std::future<Result<ObjectStat>>> futures;
  futures.reserve(keys.size());
  for (auto& p : promises) futures.push_back(p.get_future());
  for (size_t i = 0; i < keys.size(); ++i) {
    RunExchange(driver_.get(), policy_, HeadRequest(keys[i]), [p = &promises[i]](Result<HttpResponse> r) {
      if (!r.ok()) return p->set_value(r.status());
      p->set_value(ObjectStat{r->object_size == kUnknownSize ? 0 : r->object_size, r->etag});
    });
  }
  std::vector<Result<ObjectStat>> out;
  out.reserve(keys.size());
  for (auto& f : futures) out.push_back(f.get());
  return out;
}

Result<ObjectStat> ObjectClient::Stat(const std::string& key) {
  Result<HttpResponse> r = RunExchangeSync(driver_.get(), policy_, HeadRequest(key));
  if (!r.ok()) {
    // A HEAD response has no body to tell a missing bucket from a missing object: ask the bucket.
    if (r.status().code() == StatusCode::kNotFound && uri_.is_s3()) {
      if (Status b = ProbeBucket(); b.code() == StatusCode::kNotFound) return b;
    }
    return r.status();
  }
  return ObjectStat{r->object_size == kUnknownSize ? 0 : r->object_size, r->etag};
}

void ObjectClient::ReadRangeAsync(const RangeRead& range, std::function<void(Result<std::string>)> done) {
  if (range.length == 0) return done(std::string());
  HttpRequest req;
  req.op = "get";
  req.method = "GET";
  req.url = ObjectUrl(range.key);
  req.ranged = true;
  req.offset = range.offset;
  req.length = range.length;
  req.expect_etag = range.expected_etag;
  req.expect_size = range.expected_size;
  req.dest = range.dest;
  req.urgent = range.urgent;
  req.ctx = Context(range.key);
  RunExchange(driver_.get(), policy_, std::move(req), [done = std::move(done)](Result<HttpResponse> r) {
    if (!r.ok()) return done(r.status());
    done(std::move(r->body));
  });
}

Result<std::string> ObjectClient::ReadRange(const std::string& key, uint64_t offset, uint64_t length,
                                            const std::string& expected_etag, uint64_t expected_size) {
  return std::move(ReadRanges({RangeRead{key, offset, length, expected_etag, expected_size}}).front());
}

std::vector<Result<std::string>> ObjectClient::ReadRanges(const std::vector<RangeRead>& ranges) {
  std::vector<std::promise<Result<std::string>>> promises(ranges.size());
  std::vector<std::future<Result<std::string>>> futures;
  futures.reserve(ranges.size());
  for (auto& p : promises) futures.push_back(p.get_future());
  for (size_t i = 0; i < ranges.size(); ++i) {
    ReadRangeAsync(ranges[i], [p = &promises[i]](Result<std::string> r) { p->set_value(std::move(r)); });
  }
  std::vector<Result<std::string>> out;
  out.reserve(ranges.size());
  for (auto& f : futures) out.push_back(f.get());
  return out;
}

Result<ObjectBytes> ObjectClient::Get(const std::string& key) {
  HttpRequest req;
  req.op = "get";
  req.method = "GET";
  req.url = ObjectUrl(key);
  req.ctx = Context(key);
  SC_ASSIGN_OR_RETURN(HttpResponse r, RunExchangeSync(driver_.get(), policy_, std::move(req)));
  if (r.object_size != kUnknownSize && r.body.size() != r.object_size) {
    return Unavailable("GET " + uri_.Describe(key) + " from " + endpoint_ + " returned " +
                       std::to_string(r.body.size()) + " of " + std::to_string(r.object_size) + " bytes");
  }
  ReadBytesCounter()->Add(r.body.size());
  return ObjectBytes{std::move(r.body), std::move(r.etag)};
}

Result<ListPage> ObjectClient::ListPageAt(const std::string& prefix, const std::string& token) {
  // Parameters in SigV4's canonical order (sorted by name) and encoding: curl 7.88 signs the
  // query string exactly as written.
  std::string query;
  if (!token.empty()) query += "continuation-token=" + UriEncode(token, false) + "&";
  query += "list-type=2&max-keys=" + std::to_string(list_page_keys_);
  if (!prefix.empty()) query += "&prefix=" + UriEncode(prefix, false);
  HttpRequest req;
  req.op = "list";
  req.method = "GET";
  req.url = BucketUrl(query);
  req.ctx = Context("");
  SC_ASSIGN_OR_RETURN(HttpResponse r, RunExchangeSync(driver_.get(), policy_, std::move(req)));
  ListPage page;
  if (!ParseListPage(r.body, &page)) {
    return Internal(endpoint_ + " answered ListObjectsV2 of bucket " + uri_.bucket +
                    " with something that is not a ListBucketResult page");
  }
  return page;
}

Result<std::vector<ObjectInfo>> ObjectClient::List(const std::string& prefix) {
  if (!uri_.is_s3()) {
    return Unimplemented("cannot list " + uri_.Describe(prefix) +
                         ": plain http(s) stores have no listing; use an s3:// URI or name the objects");
  }
  std::vector<ObjectInfo> out;
  std::string token;
  do {
    SC_ASSIGN_OR_RETURN(ListPage page, ListPageAt(prefix, token));
    for (auto& o : page.objects) out.push_back(std::move(o));
    token = page.truncated ? page.next_token : "";
  } while (!token.empty());
  return out;
}

Result<HttpResponse> ObjectClient::Send(const std::string& op, const std::string& method, const std::string& key,
                                        const std::string& query, std::string body) {
  HttpRequest req;
  req.op = op;
  req.method = method;
  req.url = ObjectUrl(key) + (query.empty() ? "" : "?" + query);
  if (method == "PUT" || method == "POST") req.headers = {"Content-Type: application/octet-stream"};
  if (!policy_.sigv4.empty()) req.headers.push_back("x-amz-content-sha256: " + Sha256Hex(body));
  req.body = std::move(body);
  req.ctx = Context(key);
  return RunExchangeSync(driver_.get(), policy_, std::move(req));
}

Result<std::string> ObjectClient::Put(const std::string& key, const std::string& bytes) {
  if (!uri_.is_s3()) {
    return Unimplemented("cannot write " + uri_.Describe(key) + ": plain http(s) stores are read-only here");
  }
  SC_ASSIGN_OR_RETURN(HttpResponse r, Send("put", "PUT", key, "", bytes));
  return r.etag;
}

Status ObjectClient::Delete(const std::string& key) {
  if (!uri_.is_s3()) {
    return Unimplemented("cannot delete " + uri_.Describe(key) + ": plain http(s) stores are read-only here");
  }
  return Send("delete", "DELETE", key, "", "").status();
}

}  // namespace shardcache::objstore
