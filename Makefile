# shardcache — top-level entry points. `make demo` and `make test` are the README's Quick start.
BUILD_DIR ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=

.PHONY: all setup configure build test test-slow test-sanitize soak demo bench clean

all: build

setup:
	@./deploy/setup.sh

configure:
	@cmake -S . -B $(BUILD_DIR) $(CMAKE_FLAGS) >/dev/null

build: configure
	@cmake --build $(BUILD_DIR) -j $(JOBS)

# Every test but those tagged [slow] / [gpu]: C++ (ctest) then Python (pytest).
test: setup build
	@cd $(BUILD_DIR) && ctest -L unit --output-on-failure -j 2
	@./python/run_tests.sh $(BUILD_DIR) -m "not slow"

test-slow: setup build
	@cd $(BUILD_DIR) && ctest -L slow --output-on-failure
	@./python/run_tests.sh $(BUILD_DIR) -m slow

# The unit suite under ASan+UBSan and the concurrency tests under TSan (build-asan/, build-tsan/).
test-sanitize: setup
	@./tests/sanitize.sh $(JOBS)

# An hour of 2-rank epochs with trainers killed mid-batch, segment bytes flipped and the origin
# killed, reporting the node's RSS/fd/thread drift (tests/soak/soak.py; SOAK_MINUTES=60).
SOAK_MINUTES ?= 60
soak: setup build
	@/usr/bin/python3 tests/soak/soak.py --minutes $(SOAK_MINUTES)

demo: setup build
	@./scripts/demo.sh $(BUILD_DIR)

clean:
	rm -rf $(BUILD_DIR) build-asan build-tsan
