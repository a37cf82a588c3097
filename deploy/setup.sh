#!/usr/bin/env bash
# Installs every Debian package that building, testing and benchmarking shardcache needs.
# Idempotent and fast when everything is present: it asks dpkg first and calls apt-get only
# for what is missing. Run as root (or with sudo available).
set -euo pipefail

PACKAGES=(
  # build
  build-essential cmake pkg-config ccache
  # design card
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  librocksdb-dev liburing-dev libzstd-dev libspdlog-dev libfmt-dev catch2
  # the heap of shardcached and shardctl (common/allocator.h)
  libjemalloc-dev
  # object-storage upstream (objstore/): libcurl signs S3 requests itself (CURLOPT_AWS_SIGV4)
  libcurl4-openssl-dev
  # helpers preferred over hand-written code
  libxxhash-dev libtomlplusplus-dev libcli11-dev libdlpack-dev libcpp-httplib-dev libssl-dev libsystemd-dev nlohmann-json3-dev
  # python client
  python3-dev pybind11-dev python3-numpy python3-pytest python3-torch python3-pil
  # fuzzing (libFuzzer ships with clang); clang++ also runs the thread-safety check in make test
  clang libclang-rt-14-dev
  # tests and benchmarks: peers, link emulation, operations
  nginx-light curl aria2 fio openssl python3 python3-yaml systemd prometheus dpkg-dev file procps
  # s3rver (below) runs on node; botocore's signer checks libcurl's SigV4 in objstore_test
  nodejs python3-botocore
  # bench/run s3: the S3 copy tools Debian has, peers of the s3:// upstream (also upload its dataset)
  s3cmd rclone
)

# s3rver: the S3-protocol server the objstore tests start on loopback (a test dependency only),
# installed globally from npm at a pinned version; skipped when that version is on PATH.
S3RVER_VERSION=3.7.1
install_s3rver() {
  if command -v s3rver >/dev/null 2>&1 && [ "$(s3rver --version 2>/dev/null)" = "$S3RVER_VERSION" ]; then
    return 0
  fi
  if ! command -v npm >/dev/null 2>&1; then
    # Debian's nodejs ships without npm (NodeSource's includes it).
    $SUDO apt-get update -qq
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends npm >/dev/null
  fi
  echo "setup: installing s3rver@$S3RVER_VERSION from npm"
  $SUDO npm install -g --no-audit --no-fund --loglevel=error "s3rver@$S3RVER_VERSION" >/dev/null
}
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  install_s3rver
  exit 0
fi

echo "setup: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
# The Debian prometheus and nginx packages start services on install where an init system
# runs; tests start their own instances on loopback, so stop any that came up.
if command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
  $SUDO systemctl stop prometheus nginx 2>/dev/null || true
fi
install_s3rver
echo "setup: done"
