// shardctl ls DIR [--summary] [--verify]
// Prints a local dataset's summary (name, version, format, sizes) and its shards; --verify
// re-hashes every chunk against the manifest.
#include <cstdio>

#include "common/units.h"
#include "dataset/indexer.h"
#include "dataset/verifier.h"
#include "tools/shardctl/command.h"
#include "tools/shardctl/progress.h"

namespace shardcache::shardctl {
namespace {

struct LsArgs {
  std::string dir;
  bool summary = false;
  bool verify = false;
  unsigned threads = 0;
};

int RunLs(const LsArgs& a) {
  auto d = dataset::LoadDatasetDir(a.dir);
  if (!d.ok()) {
    std::fprintf(stderr, "shardctl ls: %s\n", d.status().ToString().c_str());
    return 1;
  }
  const v1::Manifest& m = (*d)->manifest;
  uint64_t chunks = 0;
  for (int i = 0; i < m.shards_size(); ++i) chunks += dataset::ChunkCount(m, static_cast<uint32_t>(i));
  std::printf("dataset  %s\n", m.name().c_str());
  std::printf("version  %s\n", (*d)->version.c_str());
  std::printf("format   %s", dataset::ShardFormatName(m.format()));
  if (m.format() == v1::RECORDS) {
    std::printf(" (%llu-byte records)", static_cast<unsigned long long>(m.record_bytes()));
  }
  if (m.format() == v1::MEGATRON) {
    std::printf(" (%u-byte tokens)", m.megatron_dtype_bytes());
  }
  std::printf("\nshards   %d\nsamples  %llu\nbytes    %s (%llu)\nchunks   %llu of %s\n",
              m.shards_size(), static_cast<unsigned long long>(m.total_samples()),
              FormatBytes(m.total_bytes()).c_str(), static_cast<unsigned long long>(m.total_bytes()),
              static_cast<unsigned long long>(chunks), FormatBytes(m.chunk_bytes()).c_str());
  if (!a.summary) {
    std::printf("\n%6s  %-40s %14s %10s %8s\n", "SHARD", "PATH", "BYTES", "SAMPLES", "CHUNKS");
    for (int i = 0; i < m.shards_size(); ++i) {
      const auto& s = m.shards(i);
      std::printf("%6d  %-40s %14llu %10llu %8llu\n", i, s.path().c_str(),
                  static_cast<unsigned long long>(s.size_bytes()),
                  static_cast<unsigned long long>(s.sample_count()),
                  static_cast<unsigned long long>(dataset::ChunkCount(m, static_cast<uint32_t>(i))));
    }
  }
  if (a.verify) {
    ProgressBar bar("verifying");
    dataset::VerifyOptions vo;
    vo.threads = a.threads;
    vo.progress = [&bar](uint64_t done, uint64_t total) { bar.Update(done, total); };
    Status s = dataset::VerifyDatasetDir(a.dir, **d, vo);
    bar.Finish();
    if (!s.ok()) {
      std::fprintf(stderr, "shardctl ls: verify failed: %s\n", s.ToString().c_str());
      return 1;
    }
    std::printf("verified %llu chunks (%s): all match the manifest\n",
                static_cast<unsigned long long>(chunks), FormatBytes(m.total_bytes()).c_str());
  }
  return 0;
}

const CommandRegistration kLs(
    "ls", "Show a local dataset directory: version, format, shards, samples, sizes",
    [](CLI::App* sub) -> std::function<int()> {
      auto a = std::make_shared<LsArgs>();
      sub->add_option("DIR", a->dir, "Dataset directory")->required();
      sub->add_flag("--summary", a->summary, "Only the summary, no per-shard table");
      sub->add_flag("--verify", a->verify, "Re-hash every chunk against the manifest");
      sub->add_option("--threads", a->threads, "Verify threads (0 = all cores)")
          ->capture_default_str();
      return [a] { return RunLs(*a); };
    });

}  // namespace
}  // namespace shardcache::shardctl
