// The verifier: checks a dataset directory against its manifest — every shard's size, every
// chunk's xxh3-128, every sample index's hash and bounds — hashing on all cores. Behind
// `shardctl ls --verify`; the origin never needs it on its hot path (chunks are re-hashed where
// they arrive), but operators use it after copying a dataset.
//
// Thread safety: VerifyDatasetDir may run concurrently; `progress` is called only on the
// calling thread.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "common/status.h"
#include "dataset/manifest.h"

namespace shardcache::dataset {

struct VerifyOptions {
  unsigned threads = 0;  // 0 = all cores
  std::function<void(uint64_t done_bytes, uint64_t total_bytes)> progress;
};

// OK when every chunk and sample index matches; otherwise DataLoss naming the first mismatching
// shard file and the chunk's byte offset (or the sample index file).
Status VerifyDatasetDir(const std::string& dir, const Dataset& dataset,
                        const VerifyOptions& options = {});

}  // namespace shardcache::dataset
