#!/usr/bin/env bash
# Runs the Python client's tests with Debian's python3 (a pyenv python3 earlier on PATH lacks
# the Debian python3-* packages the module is built against).
# Usage: run_tests.sh BUILD_DIR [PYTEST_ARGS...]
set -euo pipefail
build=${1:-build}
here=$(cd "$(dirname "$0")" && pwd)
export PYTHONPATH="$(cd "$build" && pwd)/python${PYTHONPATH:+:$PYTHONPATH}"
export SHARDCACHE_BUILD_DIR="$(cd "$build" && pwd)"
# Further arguments go to pytest (make test: -m "not slow"; make test-slow: -m slow).
exec /usr/bin/python3 -m pytest -q "$here/tests" "${@:2}"
