// libFuzzer target: FuzzLocalRequest (see fuzz_entries.h). Build with -DSHARDCACHE_FUZZ=ON and clang.
#include <google/protobuf/stubs/logging.h>

#include "daemon/fuzz/fuzz_entries.h"

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  // protobuf logs every invalid-UTF-8 string it refuses (the daemon rate-limits these, see
  // daemon/main.cc); at thousands of inputs a second they drown the fuzzer's own output.
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // Internal means an accepted request led somewhere it must not: a real bug.
  if (shardcache::daemon::fuzz::FuzzLocalRequest(data, size).code() == shardcache::StatusCode::kInternal) __builtin_trap();
  return 0;
}
