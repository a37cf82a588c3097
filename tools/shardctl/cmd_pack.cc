// shardctl pack SRC_DIR OUT_DIR [--shard-bytes N] [--chunk-bytes N] [--name NAME]
//                               [--shuffle-seed N|none | --no-shuffle]
// Packs a tree of many small files into WebDataset tar shards in OUT_DIR and indexes them;
// samples are shuffled with a fixed seed unless told otherwise (see dataset/packer.h).
//
// shardctl pack SRC_DIR s3://BUCKET/PREFIX/NAME [--staging-dir DIR] [--endpoint URL] ...
// The same shards and index written to a bucket prefix that holds nothing yet: packed into a
// staging directory, then uploaded, the manifest last (dataset/object_packer.h).
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <optional>

#include "common/units.h"
#include "dataset/indexer.h"
#include "dataset/object_packer.h"
#include "dataset/packer.h"
#include "tools/shardctl/objstore_flags.h"
#include "tools/shardctl/command.h"
#include "tools/shardctl/progress.h"

namespace shardcache::shardctl {
namespace {

struct PackArgs {
  std::string src;
  std::string out;
  std::string shard_bytes = "256MiB";
  std::string chunk_bytes = "4MiB";
  std::string name;
  std::string shuffle_seed = std::to_string(dataset::kDefaultPackShuffleSeed);
  bool no_shuffle = false;
  unsigned threads = 0;
  std::string staging_dir;
  ObjectStoreFlags store;
};

// $TMPDIR, else /tmp.
std::string DefaultStagingDir() {
  const char* tmp = std::getenv("TMPDIR");
  return tmp != nullptr && *tmp != '\0' ? tmp : "/tmp";
}

// PackDirectory, or PackToBucket for an object store URI; `where` says which in the summary.
Result<dataset::PackResult> PackDirOrBucket(const PackArgs& a, const dataset::PackOptions& o, std::string* where) {
  *where = a.out;
  if (!IsObjectUri(a.out)) return dataset::PackDirectory(a.src, a.out, o);
  SC_ASSIGN_OR_RETURN(auto client, a.store.Open(a.out));
  *where = a.out + " at " + client->endpoint();
  return dataset::PackToBucket(a.src, *client, a.staging_dir.empty() ? DefaultStagingDir() : a.staging_dir, o);
}

// "none" or a decimal seed.
Result<std::optional<uint64_t>> ParseShuffleSeed(const std::string& text) {
  if (text == "none") return std::optional<uint64_t>();
  uint64_t seed = 0;
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, seed);
  if (text.empty() || ec != std::errc() || ptr != end) {
    return InvalidArgument("--shuffle-seed '" + text + "' is neither a number nor 'none'");
  }
  return std::optional<uint64_t>(seed);
}

int RunPack(const PackArgs& a) {
  auto shard_bytes = ParseBytes(a.shard_bytes);
  auto chunk_bytes = ParseBytes(a.chunk_bytes);
  for (const auto* r : {&shard_bytes, &chunk_bytes}) {
    if (!r->ok()) {
      std::fprintf(stderr, "shardctl pack: %s\n", r->status().message().c_str());
      return 2;
    }
  }
  if (*shard_bytes == 0) {
    std::fprintf(stderr, "shardctl pack: --shard-bytes must be positive\n");
    return 2;
  }
  auto seed = ParseShuffleSeed(a.shuffle_seed);
  if (!seed.ok()) {
    std::fprintf(stderr, "shardctl pack: %s\n", seed.status().message().c_str());
    return 2;
  }
  dataset::PackOptions o;
  o.shuffle_seed = a.no_shuffle ? std::nullopt : *seed;
  o.shard_bytes = *shard_bytes;
  o.chunk_bytes = *chunk_bytes;
  o.name = a.name;
  o.threads = a.threads;
  ProgressBar bar("packing");
  o.progress = [&bar](const char* phase, uint64_t done, uint64_t total) {
    const std::string p = phase;
    bar.SetLabel(p == "pack" ? "packing" : p == "upload" ? "uploading" : "hashing");
    bar.Update(done, total);
  };
  const auto start = std::chrono::steady_clock::now();
  std::string where;
  auto r = PackDirOrBucket(a, o, &where);
  bar.Finish();
  if (!r.ok()) {
    std::fprintf(stderr, "shardctl pack: %s\n", r.status().ToString().c_str());
    return 1;
  }
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const v1::Manifest& m = r->dataset->manifest;
  const std::string order =
      o.shuffle_seed ? "shuffled with seed " + std::to_string(*o.shuffle_seed) : "in path order";
  std::printf("packed %llu files (%s) from %s into %d tar shards in %s (%s): dataset '%s' "
              "version %s, %llu samples %s, %.2f s (%.0f files/s)\n",
              static_cast<unsigned long long>(r->files), FormatBytes(r->file_bytes).c_str(),
              a.src.c_str(), m.shards_size(), where.c_str(), FormatBytes(m.total_bytes()).c_str(),
              m.name().c_str(), r->dataset->version.c_str(),
              static_cast<unsigned long long>(m.total_samples()), order.c_str(), secs,
              secs > 0 ? static_cast<double>(r->files) / secs : 0.0);
  return 0;
}

const CommandRegistration kPack(
    "pack", "Pack a tree of small files into WebDataset tar shards and index them",
    [](CLI::App* sub) -> std::function<int()> {
      auto a = std::make_shared<PackArgs>();
      sub->add_option("SRC_DIR", a->src, "Directory of files to pack")->required();
      sub->add_option("OUT_DIR", a->out,
                      "New dataset directory (must not exist or be empty), or s3://BUCKET/PREFIX/NAME "
                      "(must hold no object)")
          ->required();
      sub->add_option("--shard-bytes", a->shard_bytes, "Target tar shard size")
          ->capture_default_str();
      sub->add_option("--chunk-bytes", a->chunk_bytes, "Chunk size (transfer/cache unit)")
          ->capture_default_str();
      sub->add_option("--name", a->name,
                      "Dataset name: OUT_DIR's path below the upstream root, or its last part "
                      "(default: OUT_DIR's basename)");
      auto* seed = sub->add_option("--shuffle-seed", a->shuffle_seed,
                                   "Shuffle the samples with this seed, or 'none' for path order")
                       ->capture_default_str();
      sub->add_flag("--no-shuffle", a->no_shuffle, "Samples in path order (= --shuffle-seed none)")
          ->excludes(seed);
      sub->add_option("--threads", a->threads, "Threads (0 = all cores)")->capture_default_str();
      sub->add_option("--staging-dir", a->staging_dir,
                      "s3://: where shards are packed before the upload (default: $TMPDIR, else /tmp)");
      a->store.AddTo(sub);
      return [a] { return RunPack(*a); };
    });

}  // namespace
}  // namespace shardcache::shardctl
