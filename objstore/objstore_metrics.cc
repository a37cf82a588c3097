#include "objstore/objstore_metrics.h"

namespace shardcache::objstore {
namespace {

metrics::Counter* Labeled(const char* name, const char* help, const char* label, const std::string& value) {
  return metrics::Registry::Global().GetCounter(name, help, {{label, value}});
}

}  // namespace

metrics::Counter* RequestsCounter(const std::string& op) {
  // Few distinct ops: the registry's lookup is cheap next to an HTTP request.
  return Labeled("shardcache_objstore_requests_total", "HTTP requests (attempts) sent to object storage", "op", op);
}

metrics::Counter* ReadBytesCounter() {
  static metrics::Counter* c = metrics::Registry::Global().GetCounter(
      "shardcache_objstore_read_bytes_total", "Object bytes received from object storage by GETs");
  return c;
}

metrics::Counter* WrittenBytesCounter() {
  static metrics::Counter* c = metrics::Registry::Global().GetCounter(
      "shardcache_objstore_written_bytes_total", "Bytes uploaded to object storage by PUTs that succeeded");
  return c;
}

metrics::Counter* ChecksumFailuresCounter() {
  static metrics::Counter* c = metrics::Registry::Global().GetCounter(
      "shardcache_objstore_checksum_failures_total",
      "Chunks or blocks read from object storage whose xxh3-128 did not match the manifest");
  return c;
}

metrics::Counter* RetriesCounter(const std::string& reason) {
  return Labeled("shardcache_objstore_retries_total",
                 "Object-storage requests retried, by reason (throttled, server, dropped)", "reason", reason);
}

metrics::Counter* ErrorsCounter(const std::string& kind) {
  return Labeled("shardcache_objstore_errors_total", "Object-storage operations that failed, by kind", "kind", kind);
}

void CountError(const Status& s) {
  const char* kind = "other";
  switch (s.code()) {
    case StatusCode::kNotFound: kind = "not_found"; break;
    case StatusCode::kPermissionDenied: kind = "permission"; break;
    case StatusCode::kFailedPrecondition: kind = "changed"; break;
    case StatusCode::kUnavailable:
    case StatusCode::kDeadlineExceeded: kind = "unavailable"; break;
    default: break;
  }
  ErrorsCounter(kind)->Add();
}

}  // namespace shardcache::objstore
