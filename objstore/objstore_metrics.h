// Process-wide counters of the object-store client (metrics::Registry::Global()):
//   shardcache_objstore_requests_total{op}      HTTP attempts begun, op = get|head|list|put
//   shardcache_objstore_read_bytes_total        object bytes received by GETs (ranged or whole)
//   shardcache_objstore_written_bytes_total     bytes uploaded by PUTs that succeeded
//   shardcache_objstore_retries_total{reason}   attempts retried: reason = throttled (503
//                                               SlowDown, 429) | server (other 5xx) | dropped
//                                               (connection failed, timed out or cut mid-body)
//   shardcache_objstore_errors_total{kind}      operations that failed: kind = not_found |
//                                               permission | changed | unavailable | other
//   shardcache_objstore_checksum_failures_total chunks or blocks read whose hash did not match
//                                               the manifest (ObjectSource)
//
// Thread safety: counters are atomics; the getters register once (function-local statics).
#pragma once

#include <string>

#include "common/metrics.h"
#include "common/status.h"

namespace shardcache::objstore {

metrics::Counter* RequestsCounter(const std::string& op);
metrics::Counter* ReadBytesCounter();
metrics::Counter* WrittenBytesCounter();
metrics::Counter* RetriesCounter(const std::string& reason);
metrics::Counter* ErrorsCounter(const std::string& kind);
metrics::Counter* ChecksumFailuresCounter();
// Counts one failed operation under the kind its status code names.
void CountError(const Status& s);

}  // namespace shardcache::objstore
