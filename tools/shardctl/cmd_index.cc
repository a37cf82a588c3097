// shardctl index DIR --format records|tar|megatron [--record-bytes N] [--chunk-bytes N]
//                    [--name NAME] [--threads N]
// Writes DIR/.shardcache/{manifest.pb,samples/} for an existing directory of shards.
//
// shardctl index s3://BUCKET/PREFIX/NAME --format ... [--endpoint URL] [--region R] ...
// Indexes a dataset in a bucket in place (dataset/object_indexer.h): lists the shard objects
// under PREFIX/NAME/, reads them with ranged GETs and uploads PREFIX/NAME/.shardcache/ (the
// manifest last) — the same bytes `shardctl index` of a local copy in a directory NAME writes.
// Endpoint, region and credentials as the daemon finds them (objstore_flags.h).
#include <chrono>
#include <cstdio>

#include "common/units.h"
#include "dataset/indexer.h"
#include "dataset/object_indexer.h"
#include "tools/shardctl/objstore_flags.h"
#include "tools/shardctl/command.h"
#include "tools/shardctl/progress.h"

namespace shardcache::shardctl {
namespace {

struct IndexArgs {
  std::string dir;
  std::string format;
  std::string record_bytes = "0";
  std::string chunk_bytes = "4MiB";
  std::string name;
  unsigned threads = 0;
  ObjectStoreFlags store;
};

// IndexDirectory, or IndexBucket for an object store URI; `where` says which in the summary.
Result<dataset::DatasetPtr> IndexDirOrBucket(const IndexArgs& a, const dataset::IndexOptions& o,
                                             std::string* where) {
  *where = a.dir;
  if (!IsObjectUri(a.dir)) return dataset::IndexDirectory(a.dir, o);
  SC_ASSIGN_OR_RETURN(auto client, a.store.Open(a.dir));
  *where = a.dir + " at " + client->endpoint();
  return dataset::IndexBucket(*client, o);
}

int RunIndex(const IndexArgs& a) {
  auto format = dataset::ParseShardFormat(a.format);
  if (!format.ok()) {
    std::fprintf(stderr, "shardctl index: %s\n", format.status().message().c_str());
    return 2;
  }
  auto record_bytes = ParseBytes(a.record_bytes);
  auto chunk_bytes = ParseBytes(a.chunk_bytes);
  for (const auto* r : {&record_bytes, &chunk_bytes}) {
    if (!r->ok()) {
      std::fprintf(stderr, "shardctl index: %s\n", r->status().message().c_str());
      return 2;
    }
  }
  if (*format == v1::RECORDS && *record_bytes == 0) {
    std::fprintf(stderr, "shardctl index: --format records needs --record-bytes\n");
    return 2;
  }
  dataset::IndexOptions o;
  o.name = a.name;
  o.format = *format;
  o.record_bytes = *record_bytes;
  o.chunk_bytes = *chunk_bytes;
  o.threads = a.threads;
  ProgressBar bar("hashing");
  o.progress = [&bar](uint64_t done, uint64_t total) { bar.Update(done, total); };
  const auto start = std::chrono::steady_clock::now();
  std::string where;
  auto d = IndexDirOrBucket(a, o, &where);
  bar.Finish();
  if (!d.ok()) {
    std::fprintf(stderr, "shardctl index: %s\n", d.status().ToString().c_str());
    return 1;
  }
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const v1::Manifest& m = (*d)->manifest;
  uint64_t chunks = 0;
  for (int i = 0; i < m.shards_size(); ++i) chunks += dataset::ChunkCount(m, static_cast<uint32_t>(i));
  std::printf("indexed %s: dataset '%s' version %s, format %s, %d shards, %llu samples, %s "
              "(%llu bytes), %llu chunks of %s, %.2f s (%s/s)\n",
              where.c_str(), m.name().c_str(), (*d)->version.c_str(),
              dataset::ShardFormatName(m.format()), m.shards_size(),
              static_cast<unsigned long long>(m.total_samples()),
              FormatBytes(m.total_bytes()).c_str(),
              static_cast<unsigned long long>(m.total_bytes()),
              static_cast<unsigned long long>(chunks), FormatBytes(m.chunk_bytes()).c_str(), secs,
              FormatBytes(static_cast<uint64_t>(secs > 0 ? m.total_bytes() / secs : 0)).c_str());
  return 0;
}

const CommandRegistration kIndex(
    "index", "Index a directory of shards: manifest, chunk hashes, sample indexes",
    [](CLI::App* sub) -> std::function<int()> {
      auto a = std::make_shared<IndexArgs>();
      sub->add_option("DIR", a->dir, "Dataset directory, or s3://BUCKET/PREFIX/NAME to index a bucket in place")
          ->required();
      sub->add_option("--format", a->format, "Shard format: records | tar | megatron")
          ->required();
      sub->add_option("--record-bytes", a->record_bytes,
                      "records: bytes per record (e.g. 4096, 8KiB)");
      sub->add_option("--chunk-bytes", a->chunk_bytes, "Chunk size (transfer/cache unit)")
          ->capture_default_str();
      sub->add_option("--name", a->name,
                      "Dataset name: DIR's path below the upstream root, or its last part "
                      "(default: DIR's basename; for s3://: trailing parts of PREFIX/NAME, default NAME)");
      sub->add_option("--threads", a->threads,
                      "Hashing threads (0 = all cores; for s3://, at least " +
                          std::to_string(dataset::kMinObjectIndexThreads) + ": they wait on ranged GETs)")
          ->capture_default_str();
      a->store.AddTo(sub);
      return [a] { return RunIndex(*a); };
    });

}  // namespace
}  // namespace shardcache::shardctl
