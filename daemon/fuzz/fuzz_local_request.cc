// libFuzzer target: FuzzLocalRequest (see fuzz_entries.h). Build with -DSHARDCACHE_FUZZ=ON and clang.
#include "daemon/fuzz/fuzz_entries.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // Internal means an accepted request led somewhere it must not: a real bug.
  if (shardcache::daemon::fuzz::FuzzLocalRequest(data, size).code() == shardcache::StatusCode::kInternal) __builtin_trap();
  return 0;
}
