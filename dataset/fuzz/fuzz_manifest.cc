// libFuzzer target: FuzzManifest (see fuzz_entries.h). Build with -DSHARDCACHE_FUZZ=ON and clang.
#include <google/protobuf/stubs/logging.h>

#include "dataset/fuzz/fuzz_entries.h"

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  // protobuf logs every invalid-UTF-8 string it refuses; at thousands of inputs a second that
  // drowns the fuzzer's own output.
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const shardcache::Status s = shardcache::dataset::fuzz::FuzzManifest(data, size);
  // Internal means the parser accepted input it reports ranges outside of: a real bug.
  if (s.code() == shardcache::StatusCode::kInternal) __builtin_trap();
  return 0;
}
