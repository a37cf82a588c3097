#!/usr/bin/env bash
# GPU staging on a machine with an NVIDIA GPU: builds (or takes prebuilt) gpu_test and
# bench_stage, runs the [gpu] test cases (byte-exact staging, kernels against their CPU
# references, the device-memory tier) and the GPU benchmark (stager H2D rate next to a plain
# pinned cudaMemcpyAsync = over_peak; stall_fraction of a synthetic training loop whose step is
# 2.5× the copy time). Finishes within 8 minutes. Last stdout line: one JSON object.
#
#   tests/gpu/run_on_device.sh            run (on the GPU machine)
#   tests/gpu/run_on_device.sh --pack     build here with nvcc (no GPU needed) and pack stripped
#                                         binaries + the non-system shared libraries they need
#                                         into build-gpu-prebuilt/, for a GPU machine that lacks
#                                         the build dependencies and cannot reach apt
#                                         (carry build-gpu-prebuilt with the working tree).
#
# How it gets binaries, in order: (1) the build dependencies are installed → configure and build
# build-gpu/ with CUDA for this GPU's architecture; (2) build-gpu-prebuilt/ exists → use it;
# (3) apt works → deploy/setup.sh, then (1); (4) otherwise give up (exit 2).
# SC_GPU_USE_PREBUILT=1 skips (1): take build-gpu-prebuilt/ when it exists.
# Exit status: 0 when the [gpu] tests pass, over_peak >= 0.9 and stall_fraction <= 0.02;
# 1 when something failed or a figure missed its mark; 2 when it could not run at all.
# Writes run_on_device.log and result.json under $OUT when that is set.
set -uo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=${BUILD_DIR:-$ROOT/build-gpu}
PREBUILT=$ROOT/build-gpu-prebuilt
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
export PATH=$CUDA_HOME/bin:$PATH
START=$(date +%s)
BUDGET_S=470  # 8 minutes less a margin for the caller
OUT_DIR=${OUT:-}

log() { echo "[run_on_device $(( $(date +%s) - START ))s] $*" >&2; }
left() { echo $(( BUDGET_S - ($(date +%s) - START) )); }
json_escape() { python3 -c 'import json,sys; print(json.dumps(sys.stdin.read().strip()))' 2>/dev/null || echo '""'; }

pack() {
  local b=$ROOT/build-gpu-pack
  cmake -S "$ROOT" -B "$b" -DCMAKE_CUDA_ARCHITECTURES="80-real;90" >/dev/null || return 1
  nice cmake --build "$b" -j "$(nproc)" --target gpu_test bench_stage || return 1
  rm -rf "$PREBUILT" && mkdir -p "$PREBUILT/bin" "$PREBUILT/lib"
  for t in gpu_test bench_stage; do strip -o "$PREBUILT/bin/$t" "$b/bin/$t" || return 1; done
  # Shared libraries a bare Debian/Ubuntu box may lack: everything but libc/libstdc++/libgcc/libm.
  ldd "$b/bin/gpu_test" "$b/bin/bench_stage" | awk '/=> \//{print $3}' | sort -u |
    grep -v -E '/(libc|libm|libstdc\+\+|libgcc_s|libdl|libpthread|librt|ld-linux[^/]*)\.so' |
    while read -r lib; do cp -L "$lib" "$PREBUILT/lib/"; done
  git -C "$ROOT" rev-parse HEAD > "$PREBUILT/STAMP" 2>/dev/null || date > "$PREBUILT/STAMP"
  du -sh "$PREBUILT"
  echo "packed into $PREBUILT (built from $(cat "$PREBUILT/STAMP"))"
}

if [ "${1:-}" = "--pack" ]; then pack; exit $?; fi

finish() {  # $1 exit status, $2 JSON
  if [ -n "$OUT_DIR" ]; then echo "$2" > "$OUT_DIR/result.json"; fi
  echo "$2"
  exit "$1"
}

if [ -n "$OUT_DIR" ]; then mkdir -p "$OUT_DIR"; exec 2> >(tee -a "$OUT_DIR/run_on_device.log" >&2); fi

# ---- the GPU ------------------------------------------------------------------------------
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
  log "no NVIDIA GPU visible (nvidia-smi missing or failing)"
  finish 2 '{"scenario":"gpu_stage","ok":false,"error":"no GPU visible"}'
fi
GPU=$(nvidia-smi --query-gpu=name,compute_cap,driver_version --format=csv,noheader | head -1)
CC=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d ' .')
log "GPU: $GPU (arch $CC); nvcc: $(nvcc --version 2>/dev/null | tail -1 || echo none)"

# ---- binaries -----------------------------------------------------------------------------
have_deps() {
  command -v cmake >/dev/null && command -v nvcc >/dev/null && command -v protoc >/dev/null &&
    command -v grpc_cpp_plugin >/dev/null && pkg-config --exists libxxhash liburing libzstd tomlplusplus 2>/dev/null &&
    [ -f /usr/include/catch2/catch.hpp ] && [ -d /usr/include/spdlog ] && [ -d /usr/include/rocksdb ] &&
    [ -f /usr/include/dlpack/dlpack.h ]
}
build() {
  log "configuring $BUILD with CUDA for sm_${CC}"
  cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="${CC}" \
    -DSHARDCACHE_CUDA=ON >"$BUILD.configure.log" 2>&1 || { tail -30 "$BUILD.configure.log" >&2; return 1; }
  grep -q "CUDA .* found" "$BUILD.configure.log" || { log "configure did not find CUDA"; return 1; }
  log "building gpu_test bench_stage"
  local t=$(( $(left) - 150 )); [ "$t" -lt 60 ] && t=60
  timeout "$t" cmake --build "$BUILD" -j "$(nproc)" --target gpu_test bench_stage >"$BUILD.build.log" 2>&1 ||
    { tail -40 "$BUILD.build.log" >&2; return 1; }
  BIN=$BUILD/bin
}
BIN=""
SOURCE=""
if [ "${SC_GPU_USE_PREBUILT:-0}" != 1 ] && have_deps; then
  build && SOURCE=built
fi
if [ -z "$BIN" ] && [ -x "$PREBUILT/bin/gpu_test" ] && [ -x "$PREBUILT/bin/bench_stage" ]; then
  BIN=$PREBUILT/bin
  SOURCE="prebuilt@$(cut -c1-12 "$PREBUILT/STAMP" 2>/dev/null)"
  export LD_LIBRARY_PATH="$PREBUILT/lib:$CUDA_HOME/lib64:$CUDA_HOME/lib:${LD_LIBRARY_PATH:-}"
  log "using prebuilt binaries from $PREBUILT (git $SOURCE)"
fi
if [ -z "$BIN" ] && command -v apt-get >/dev/null && timeout 90 apt-get update -qq >/dev/null 2>&1; then
  log "installing build dependencies with deploy/setup.sh"
  t=$(( $(left) - 300 )); [ "$t" -lt 60 ] && t=60
  if timeout "$t" "$ROOT/deploy/setup.sh" >&2 && have_deps; then build && SOURCE=built; fi
fi
if [ -z "$BIN" ]; then
  log "no way to get binaries: build dependencies missing, no $PREBUILT, apt unreachable"
  finish 2 '{"scenario":"gpu_stage","ok":false,"error":"cannot build: dependencies missing and no prebuilt binaries"}'
fi
export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}:$CUDA_HOME/lib64:$CUDA_HOME/lib"
if ldd "$BIN/gpu_test" | grep -q "not found"; then
  log "missing shared libraries: $(ldd "$BIN/gpu_test" | grep 'not found' | tr '\n' ' ')"
  finish 2 '{"scenario":"gpu_stage","ok":false,"error":"shared libraries missing"}'
fi

# ---- [gpu] tests (and the host variants, which are cheap) ---------------------------------
log "running the [gpu] test cases"
TEST_LOG=$(mktemp)
timeout 150 "$BIN/gpu_test" "[gpu]" --durations yes >"$TEST_LOG" 2>&1
TEST_RC=$?
grep -v '^\[20' "$TEST_LOG" | tail -25 >&2
SUMMARY=$(grep -E '^(All tests passed|test cases:)' "$TEST_LOG" | tail -1)
# "All tests passed (N assertions in M test cases)" or "test cases: M | ...".
GPU_CASES=$(echo "$SUMMARY" | sed -n -e 's/.* in \([0-9]*\) test cases.*/\1/p' -e 's/^test cases: *\([0-9]*\).*/\1/p')
timeout 60 "$BIN/gpu_test" "~[gpu]" >/dev/null 2>&1
HOST_RC=$?
log "[gpu] tests: rc=$TEST_RC ($SUMMARY); host variants: rc=$HOST_RC"

# ---- benchmark ----------------------------------------------------------------------------
BENCH_T=$(( $(left) - 10 ))
[ "$BENCH_T" -gt 240 ] && BENCH_T=240
log "running bench_stage (limit ${BENCH_T}s)"
BENCH_LOG=$(mktemp)
timeout "$BENCH_T" "$BIN/bench_stage" --cuda >"$BENCH_LOG" 2>&1
BENCH_RC=$?
cat "$BENCH_LOG" >&2
BENCH_JSON=$(grep '^{' "$BENCH_LOG" | tail -1)
[ -n "$BENCH_JSON" ] || BENCH_JSON='{}'

# ---- verdict ------------------------------------------------------------------------------
RESULT=$(BENCH_JSON="$BENCH_JSON" TEST_RC=$TEST_RC HOST_RC=$HOST_RC BENCH_RC=$BENCH_RC GPU="$GPU" \
  SOURCE="$SOURCE" SUMMARY="$SUMMARY" GPU_CASES="$GPU_CASES" WALL=$(( $(date +%s) - START )) python3 - <<'EOF'
import json, os
b = json.loads(os.environ["BENCH_JSON"] or "{}")
r = {"scenario": "gpu_stage_device", "gpu": os.environ["GPU"], "binaries": os.environ["SOURCE"],
     "gpu_tests_rc": int(os.environ["TEST_RC"]), "gpu_tests": os.environ["SUMMARY"],
     "gpu_test_cases": int(os.environ["GPU_CASES"] or 0), "host_tests_rc": int(os.environ["HOST_RC"]),
     "bench_rc": int(os.environ["BENCH_RC"]), "wall_s": int(os.environ["WALL"])}
for k in ("peak_gbps", "stager_gbps", "over_peak", "bounce_gbps", "copy_ms", "step_ms", "stall_fraction",
          "register_s", "batch_bytes", "depth"):
    if k in b: r[k] = b[k]
r["over_peak_ok"] = b.get("over_peak", 0) >= 0.9
r["stall_ok"] = "stall_fraction" in b and b["stall_fraction"] <= 0.02
r["ok"] = (r["gpu_tests_rc"] == 0 and r["gpu_test_cases"] > 0 and r["bench_rc"] == 0
           and r["over_peak_ok"] and r["stall_ok"])
print(json.dumps(r))
EOF
)
if [ -z "$RESULT" ]; then  # no python3: report the raw pieces
  RESULT="{\"scenario\":\"gpu_stage_device\",\"gpu_tests_rc\":$TEST_RC,\"bench_rc\":$BENCH_RC,\"bench\":$BENCH_JSON}"
fi
log "done"
case "$RESULT" in *'"ok": true'*) finish 0 "$RESULT" ;; *) finish 1 "$RESULT" ;; esac
