// libFuzzer target: FuzzMegatronIdx (see fuzz_entries.h). Build with -DSHARDCACHE_FUZZ=ON and clang.
#include "dataset/fuzz/fuzz_entries.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const shardcache::Status s = shardcache::dataset::fuzz::FuzzMegatronIdx(data, size);
  // Internal means the parser accepted input it reports ranges outside of: a real bug.
  if (s.code() == shardcache::StatusCode::kInternal) __builtin_trap();
  return 0;
}
