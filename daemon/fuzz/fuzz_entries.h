// Listener entry points for fuzzing: what each of the daemon's listeners does with the bytes a
// client sends, up to the point where a request is accepted or refused. Shared by the libFuzzer
// targets (daemon/fuzz/fuzz_*.cc, -DSHARDCACHE_FUZZ=ON with clang) and the corpus regression test
// (tests/fuzz), so `make test` runs every committed corpus file through exactly this code.
//
// Each returns OK for an accepted request, an error for a refused one, and never crashes or
// hangs on any input; Internal means an accepted request led somewhere it must not (a bug).
//
// Thread safety: FuzzAdminRequest starts one admin server per process on first use; the others
// are pure functions.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/status.h"

namespace shardcache::daemon::fuzz {

// Input: the body of a local-protocol frame (a serialized LocalRequest). An OpenLoader goes
// through the daemon's request check (daemon/serve/loader_request.h) and, once accepted, the
// planner over a fixed dataset of 7 shards and 1000 samples: the plan is built and sliced, and
// the slice's first, middle and last samples must be ids of that dataset.
Status FuzzLocalRequest(const uint8_t* data, size_t size);

// Input: one byte naming the Origin request (0 ReadChunks, 1 GetSampleIndex, 2 GetManifest,
// 3 BeginUpload, 4 PutPart: the checks before any file is touched),
// then its serialized message; checked as the Origin service checks it against a fixed dataset
// "recs" (name rules, version, shard and chunk range).
Status FuzzOriginRequest(const uint8_t* data, size_t size);

// Input: a config file (TOML), parsed and validated as `shardcached --check` does.
Status FuzzConfig(const uint8_t* data, size_t size);

// Input: one raw HTTP request, sent to an admin server on loopback (the daemon's
// admin_server.cc with stub handlers). OK for a 2xx answer, InvalidArgument for another answer or
// none; the server must survive every input.
Status FuzzAdminRequest(const uint8_t* data, size_t size);

}  // namespace shardcache::daemon::fuzz
