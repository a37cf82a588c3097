// sc_datagen: writes synthetic datasets for the demo and benchmarks — data only, no index
// (run `shardctl index` / `shardctl pack` on the result). Content comes from
// dataset/synthetic.h, so it is a pure function of the seed and readers can recompute it.
//
//   sc_datagen records  OUT --shards N --records-per-shard N --record-bytes N
//                           [--kind random|tokens] [--seed S]
//   sc_datagen tar      OUT --shards N --samples-per-shard N [--min-bytes N] [--max-bytes N]
//   sc_datagen megatron OUT --shards N --sequences-per-shard N [--min-tokens N] [--max-tokens N]
//   sc_datagen files    OUT --count N [--min-bytes N] [--max-bytes N] [--dirs N]
//
// Shards are written in parallel (one thread per shard, up to --threads).
#include <sys/stat.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>

#include <CLI/CLI.hpp>

#include "common/fs.h"
#include "common/units.h"
#include "dataset/parallel_for.h"
#include "dataset/synthetic.h"

namespace syn = shardcache::dataset::synthetic;
using shardcache::Result;
using shardcache::Status;

namespace {

struct Args {
  std::string out;
  uint64_t shards = 4;
  uint64_t items = 0;  // records / samples / sequences per shard, or files
  std::string record_bytes = "4KiB";
  std::string kind = "random";
  std::string min_bytes = "2KiB";
  std::string max_bytes = "64KiB";
  uint64_t min_tokens = 128;
  uint64_t max_tokens = 4096;
  uint64_t dirs = 100;
  uint64_t seed = 1;
  unsigned threads = 0;
};

std::string ShardPath(const std::string& out, const char* stem, uint64_t shard, const char* ext) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "/%s-%05llu%s", stem, static_cast<unsigned long long>(shard), ext);
  return out + buf;
}

uint64_t TreeBytes(const std::string& dir) {
  uint64_t total = 0;
  std::error_code ec;
  for (auto it = std::filesystem::recursive_directory_iterator(dir, ec);
       it != std::filesystem::recursive_directory_iterator(); it.increment(ec)) {
    if (ec) break;
    if (it->is_regular_file(ec)) total += it->file_size(ec);
  }
  return total;
}

int Fail(const Status& s) {
  std::fprintf(stderr, "sc_datagen: %s\n", s.ToString().c_str());
  return 1;
}

int Usage(const std::string& what) {
  std::fprintf(stderr, "sc_datagen: %s\n", what.c_str());
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"sc_datagen — write synthetic shardcache datasets (data only, no index)"};
  app.require_subcommand(1);
  Args a;
  auto common = [&a](CLI::App* sub) {
    sub->add_option("OUT", a.out, "Output directory (created)")->required();
    sub->add_option("--seed", a.seed, "Content seed")->capture_default_str();
    sub->add_option("--threads", a.threads, "Writer threads (0 = all cores)");
  };
  CLI::App* records = app.add_subcommand("records", "Fixed-size records shards (shard-NNNNN.bin)");
  common(records);
  records->add_option("--shards", a.shards, "Shard count")->capture_default_str();
  records->add_option("--records-per-shard", a.items, "Records per shard")->required();
  records->add_option("--record-bytes", a.record_bytes, "Bytes per record")->capture_default_str();
  records->add_option("--kind", a.kind, "random (incompressible) | tokens (uint16 Zipf)")
      ->capture_default_str();
  CLI::App* tar = app.add_subcommand("tar", "WebDataset tar shards of .jpg/.cls samples");
  common(tar);
  tar->add_option("--shards", a.shards, "Shard count")->capture_default_str();
  tar->add_option("--samples-per-shard", a.items, "Samples per shard")->required();
  tar->add_option("--min-bytes", a.min_bytes, "Smallest .jpg")->capture_default_str();
  tar->add_option("--max-bytes", a.max_bytes, "Largest .jpg")->capture_default_str();
  CLI::App* meg = app.add_subcommand("megatron", "Megatron-LM indexed dataset (.bin + .idx)");
  common(meg);
  meg->add_option("--shards", a.shards, "Shard (.bin/.idx pair) count")->capture_default_str();
  meg->add_option("--sequences-per-shard", a.items, "Sequences per shard")->required();
  meg->add_option("--min-tokens", a.min_tokens, "Shortest sequence")->capture_default_str();
  meg->add_option("--max-tokens", a.max_tokens, "Longest sequence")->capture_default_str();
  CLI::App* files = app.add_subcommand("files", "A tree of small files (train/class-NNN/img-N.{jpg,cls})");
  common(files);
  files->add_option("--count", a.items, "Number of files")->required();
  files->add_option("--min-bytes", a.min_bytes, "Smallest .jpg")->capture_default_str();
  files->add_option("--max-bytes", a.max_bytes, "Largest .jpg")->capture_default_str();
  files->add_option("--dirs", a.dirs, "Class folders")->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }

  auto record_bytes = shardcache::ParseBytes(a.record_bytes);
  auto min_bytes = shardcache::ParseBytes(a.min_bytes);
  auto max_bytes = shardcache::ParseBytes(a.max_bytes);
  for (const auto* r : {&record_bytes, &min_bytes, &max_bytes}) {
    if (!r->ok()) return Usage(r->status().message());
  }
  if (*min_bytes > *max_bytes) return Usage("--min-bytes is larger than --max-bytes");
  if (a.min_tokens > a.max_tokens) return Usage("--min-tokens is larger than --max-tokens");
  if (Status s = shardcache::MakeDirs(a.out); !s.ok()) return Fail(s);

  const auto start = std::chrono::steady_clock::now();
  Status s;
  if (records->parsed()) {
    syn::RecordKind kind;
    if (a.kind == "random") kind = syn::RecordKind::kRandom;
    else if (a.kind == "tokens") kind = syn::RecordKind::kTokens;
    else return Usage("--kind must be random or tokens");
    if (*record_bytes == 0) return Usage("--record-bytes must be positive");
    s = shardcache::dataset::ParallelFor(a.shards, a.threads, [&](uint64_t i) {
      return syn::WriteRecordsShard(ShardPath(a.out, "shard", i, ".bin"), kind, a.seed, i, a.items,
                                    *record_bytes);
    });
  } else if (tar->parsed()) {
    s = shardcache::dataset::ParallelFor(a.shards, a.threads, [&](uint64_t i) {
      return syn::WriteTarShard(ShardPath(a.out, "shard", i, ".tar"), a.seed, i, a.items,
                                *min_bytes, *max_bytes);
    });
  } else if (meg->parsed()) {
    s = shardcache::dataset::ParallelFor(a.shards, a.threads, [&](uint64_t i) {
      return syn::WriteMegatronShard(ShardPath(a.out, "part", i, ".bin"),
                                     ShardPath(a.out, "part", i, ".idx"), a.seed, i, a.items,
                                     a.min_tokens, a.max_tokens);
    });
  } else {
    uint64_t bytes = 0;
    s = syn::WriteFileTree(a.out, a.seed, a.items, *min_bytes, *max_bytes, a.dirs, &bytes);
  }
  if (!s.ok()) return Fail(s);
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const uint64_t bytes = TreeBytes(a.out);
  std::printf("sc_datagen: wrote %s (%llu bytes) to %s in %.2f s (%s/s)\n",
              shardcache::FormatBytes(bytes).c_str(), static_cast<unsigned long long>(bytes),
              a.out.c_str(), secs,
              shardcache::FormatBytes(static_cast<uint64_t>(secs > 0 ? bytes / secs : 0)).c_str());
  return 0;
}
