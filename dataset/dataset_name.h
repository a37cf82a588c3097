// Dataset names. A daemon serves the dataset in directory ROOT/<name> of its file upstream under
// <name>: its directory's path below the upstream root, one or more '/'-separated components
// ("tokens-v3", "laion/train"). Every tier (file and gRPC upstreams, the cache, the Origin and
// local services, the admin endpoint) takes a name only after CheckDatasetName, so a name can
// never lead out of the root nor into a dataset's .shardcache directory.
//
// The manifest's `name` field records what `shardctl index` / `shardctl pack` was told (--name,
// or the directory's basename). It must equal trailing components of the directory's path
// (NameIsTailOf), so it is the name the dataset is served under when the upstream root is the
// directory that many levels up. A daemon always serves a dataset under its path; a manifest
// whose name no longer matches (a directory renamed or moved after indexing) is still served.
//
// Thread safety: pure functions.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "common/status.h"

namespace shardcache::dataset {

// Linux NAME_MAX: no directory entry is longer.
constexpr size_t kMaxDatasetNameComponentBytes = 255;
constexpr size_t kMaxDatasetNameComponents = 16;
constexpr size_t kMaxDatasetNameBytes = 1024;

// OK for a name of 1 to kMaxDatasetNameComponents '/'-separated components, each non-empty, not
// starting with '.' (no ".", "..", ".shardcache" or hidden directories) and at most 255 bytes,
// the whole at most kMaxDatasetNameBytes of valid UTF-8 without backslashes or control
// characters. Otherwise InvalidArgument naming the name and what is wrong with it (a leading or
// trailing '/' and "//" are empty components).
Status CheckDatasetName(std::string_view name);

// True when `tail` equals the last components of `path` ('/'-separated; "train" and
// "laion/train" are tails of "/srv/data/laion/train", "rain" is not).
bool NameIsTailOf(std::string_view tail, std::string_view path);

}  // namespace shardcache::dataset
