// The bucket indexer: `shardctl index s3://BUCKET/PREFIX/NAME` — the object-storage twin of
// IndexDirectory (indexer.h). A dataset in a bucket has the layout ObjectSource
// (daemon/upstream/object_source.h) reads: shards at PREFIX/NAME/<shard path>, sample indexes
// at PREFIX/NAME/.shardcache/samples/<i>.pb, the manifest at PREFIX/NAME/.shardcache/manifest.pb.
//
// IndexBucket lists every object under PREFIX/NAME/, picks the shards with the same rules as a
// directory (shard_discovery.h), reads them in place with ranged GETs (ObjectByteSource: tar
// headers from cached blocks, chunks straight into the hasher's buffer, each read pinned to the
// size and ETag the listing gave), builds the index with the directory indexer's code
// (index_builder.h) — byte-identical to indexing a local copy of the same shards in a directory
// named NAME — and uploads the sample indexes, then, once all are stored, the manifest, so a
// reader never sees a manifest whose sample indexes are missing. Sample indexes left over from
// an earlier index with more shards are left in place (ObjectClient has no DELETE yet); no
// reader looks past the manifest's shard count.
//
// Thread safety: IndexBucket may run concurrently on different prefixes; the client is shared
// safely. `progress` is called only on the calling thread.
#pragma once

#include <string>

#include "common/status.h"
#include "dataset/index_builder.h"
#include "dataset/indexer.h"
#include "dataset/manifest.h"
#include "objstore/object_client.h"

namespace shardcache::dataset {

// Workers when IndexOptions::threads is 0: at least this many, more on a bigger machine (all
// cores), since an object worker mostly waits for its GET: 16 ranged GETs of 4 MiB chunks in
// flight keep a link of a few Gbit/s at 20-50 ms round trips busy.
constexpr unsigned kMinObjectIndexThreads = 16;
unsigned ObjectIndexThreads(unsigned requested);

// The manifest name of the dataset at `uri` (s3://BUCKET/PREFIX/NAME): `requested`, which must
// be trailing components of PREFIX/NAME (the name it is served under when the upstream is the
// bucket prefix that many levels up), or NAME. InvalidArgument for a URI without a prefix (a
// dataset lives below one) and for a name CheckDatasetName or NameIsTailOf refuses.
Result<std::string> ObjectDatasetName(const objstore::ObjectUri& uri, const std::string& requested);

// Indexes the dataset at client.uri() in place and returns it as loaded from the uploaded
// manifest. Errors name what was wrong: NotFound for a missing bucket ("bucket B does not exist
// at ENDPOINT"), for no objects under the prefix, or no shards among them; PermissionDenied for
// refused credentials; FailedPrecondition naming an object that changed while being indexed;
// the indexer's errors (InvalidArgument, DataLoss) naming the object and offset.
Result<DatasetPtr> IndexBucket(objstore::ObjectClient& client, const IndexOptions& options);

// Stores `index` as the dataset at client.uri(): every sample index (on `threads` concurrent
// PUTs), then the manifest. Nothing is written after the first failure.
Status UploadIndex(objstore::ObjectClient& client, const BuiltIndex& index, unsigned threads);

}  // namespace shardcache::dataset
