// UTF-8 validation. Manifest and sample-index strings (shard paths, tar keys and extensions,
// dataset names) are proto3 `string` fields, which protobuf refuses to parse unless they are
// valid UTF-8 — so the indexer checks names up front and reports the file, rather than writing
// a manifest nobody can load.
//
// Thread safety: pure functions.
#pragma once

#include <cstddef>
#include <string_view>

namespace shardcache::dataset {

// Length (1-4) of the valid UTF-8 sequence starting at s[i], or 0 when the bytes there are not
// one (stray continuation, overlong form, surrogate, above U+10FFFF, truncated).
// REQUIRES: i < s.size().
size_t Utf8SequenceLength(std::string_view s, size_t i);
bool IsValidUtf8(std::string_view s);

}  // namespace shardcache::dataset
