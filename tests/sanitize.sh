#!/usr/bin/env bash
# make test-sanitize: the unit suite built with AddressSanitizer + UndefinedBehaviorSanitizer,
# and the daemon's concurrency tests (local service, pipeline, assembler, arena, cache tiers,
# plans) built with ThreadSanitizer. Any report from project code fails the run.
#
#   tests/sanitize.sh [JOBS]      build dirs: build-asan/, build-tsan/ (CUDA off: nvcc code is
#                                 not instrumented, and no GPU runs here)
#
# TSan suppressions (tests/tsan.supp) cover only libraries that are not instrumented (gRPC,
# abseil, protobuf, RocksDB from Debian); each entry says why.
set -euo pipefail
jobs=${1:-$(nproc)}
src=$(cd "$(dirname "$0")/.." && pwd)
# -O1 -g1: sanitizer reports keep function names and line numbers, and the build takes about
# half the time of RelWithDebInfo's full debug info on CI's 2 cores.
flags=(-DCMAKE_BUILD_TYPE=Debug "-DCMAKE_CXX_FLAGS_DEBUG=-O1 -g1" "-DCMAKE_C_FLAGS_DEBUG=-O1 -g1"
       -DSHARDCACHE_CUDA=OFF)

echo "== ASan + UBSan: the unit suite"
cmake -S "$src" -B "$src/build-asan" -DSHARDCACHE_SANITIZE=address,undefined "${flags[@]}" >/dev/null
cmake --build "$src/build-asan" -j "$jobs"
export ASAN_OPTIONS="abort_on_error=1:detect_leaks=1:detect_stack_use_after_return=0:strict_string_checks=1"
export LSAN_OPTIONS="suppressions=$src/tests/lsan.supp:print_suppressions=0"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
(cd "$src/build-asan" && ctest -L unit --output-on-failure -j 2)

echo "== TSan: the concurrency tests"
cmake -S "$src" -B "$src/build-tsan" -DSHARDCACHE_SANITIZE=thread "${flags[@]}" >/dev/null
cmake --build "$src/build-tsan" -j "$jobs" --target serve_local_test cache_test plan_test local_client_helper
export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:suppressions=$src/tests/tsan.supp"
"$src/build-tsan/bin/plan_test" "~[slow]" --durations no
"$src/build-tsan/bin/serve_local_test" "~[slow]~[gpu]" --durations no
"$src/build-tsan/bin/cache_test" "~[slow]" --durations no
echo "== sanitizers: clean"
