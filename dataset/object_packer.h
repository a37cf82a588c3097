// The bucket packer: `shardctl pack SRC s3://BUCKET/PREFIX/NAME` — PackDirectory (packer.h)
// with a bucket prefix as its output.
//
// Staged, not streamed: the shards are packed and indexed into a fresh directory below
// `staging_dir` (named NAME, so the manifest is the one IndexBucket would write for the same
// shards), then uploaded — every shard, then the sample indexes, then the manifest last
// (UploadIndex), so a reader never sees a manifest whose shards or sample indexes are missing —
// and the staging directory is removed, whatever the outcome. Staging reuses the packer and the
// indexer as they are (all cores, the same shard layout and shuffle) at the cost of local disk
// the size of the dataset; streaming tar shards straight into multipart uploads would avoid
// that. Each shard is one PUT of the whole shard held in memory (ObjectClient::Put): S3 takes up
// to 5 GiB per PUT, and at most kPackUploadStreams shards are held at once.
//
// Thread safety: PackToBucket may run concurrently on different prefixes. `progress` is called
// only on the calling thread, with phase "pack", "index" or "upload".
#pragma once

#include <string>

#include "common/status.h"
#include "dataset/packer.h"
#include "objstore/object_client.h"

namespace shardcache::dataset {

// Shards uploaded at once (each held in memory whole: 8 x 256 MiB by default).
constexpr unsigned kPackUploadStreams = 8;

// Packs `src` into the dataset at client.uri(), which must hold no object yet
// (FailedPrecondition naming the prefix and how many it holds). Errors name the path or
// object: PackDirectory's, ObjectDatasetName's, and the object store's (NotFound for a missing
// bucket, PermissionDenied for refused credentials), checked before anything is packed.
Result<PackResult> PackToBucket(const std::string& src, objstore::ObjectClient& client, const std::string& staging_dir,
                                const PackOptions& options);

}  // namespace shardcache::dataset
