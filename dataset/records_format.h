// The `records` shard format: a file of fixed-size records (tokenized sequences, preprocessed
// tensors). Sample i is bytes [i*record_bytes, (i+1)*record_bytes); nothing is read from the
// file, only its size matters.
//
// Thread safety: a pure function.
#pragma once

#include <cstdint>
#include <string>

#include "common/status.h"
#include "shardcache/manifest.pb.h"

namespace shardcache::dataset {

// Sample index of a records shard of `size_bytes`. InvalidArgument naming `path` and both sizes
// when record_bytes is 0 or size_bytes is not a multiple of it.
Result<v1::SampleIndex> IndexRecordsShard(const std::string& path, uint64_t size_bytes,
                                          uint64_t record_bytes);

}  // namespace shardcache::dataset
