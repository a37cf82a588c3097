#include "common/version.h"

namespace shardcache {

// SHARDCACHE_VERSION is defined for this file alone (common/CMakeLists.txt), so a version bump
// recompiles one file.
const char* Version() { return SHARDCACHE_VERSION; }

}  // namespace shardcache
