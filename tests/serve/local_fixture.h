// Shared by the local-service tests: a data root with a records and a tar dataset served by a
// FileSource, the samples as the files hold them, and an epoch read through the C++ client that
// checks every byte.
#pragma once

#include <catch2/catch.hpp>

#include <memory>
#include <string>
#include <vector>

#include "common/fs.h"
#include "daemon/serve/local_service.h"
#include "daemon/upstream/file_source.h"
#include "dataset/manifest.h"
#include "shardcache/client.h"
#include "testing/datasets.h"
#include "testing/temp_dir.h"

namespace shardcache::testing {

// Reads every sample of a dataset straight from its files, by global id.
class ExpectedSamples {
 public:
  ExpectedSamples(const std::string& dir, const dataset::Dataset& d) {
    for (int s = 0; s < d.manifest.shards_size(); ++s) {
      auto bytes = ReadFileToString(dir + "/" + d.manifest.shards(s).path());
      REQUIRE(bytes.ok());
      auto idx = dataset::LoadSampleIndex(dir, d.manifest, s);
      REQUIRE(idx.ok());
      for (int i = 0; i < idx->offsets_size(); ++i) {
        samples_.push_back(bytes->substr(idx->offsets(i), idx->lengths(i)));
      }
    }
  }
  const std::string& operator[](uint64_t id) const { return samples_.at(id); }
  size_t size() const { return samples_.size(); }

 private:
  std::vector<std::string> samples_;
};

struct Fixture {
  TempDir tmp;
  std::string root = tmp.path() + "/data";
  std::string socket = tmp.path() + "/run/sc.sock";
  std::unique_ptr<upstream::FileSource> files;
  dataset::DatasetPtr records;
  dataset::DatasetPtr tars;

  Fixture() {
    REQUIRE(MakeDirs(root).ok());
    // 4 shards x 250 records of 1000 bytes in 64 KiB chunks: records straddle chunk edges.
    auto r = testing::MakeRecordsDataset(root, "rec", 4, 250, 1000, 64 * 1024);
    REQUIRE(r.ok());
    records = *r;
    auto t = testing::MakeTarDataset(root, "tars", 3, 40, 500, 9000, 64 * 1024);
    REQUIRE(t.ok());
    tars = *t;
    auto f = upstream::FileSource::Open(root);
    REQUIRE(f.ok());
    files = std::move(*f);
  }

  serve::LocalServiceOptions Options() const {
    serve::LocalServiceOptions o;
    o.socket_path = socket;
    o.arena_bytes = 4 << 20;
    o.slot_count = 8;
    o.prefetch_lookahead_bytes = 512 << 10;
    o.assembler.read_threads = 4;
    return o;
  }
};

struct EpochRead {
  std::vector<std::vector<uint64_t>> batches;  // sample ids per batch
  std::vector<uint64_t> all;
};

// Reads a whole epoch through the C++ client, checking every sample's bytes.
inline EpochRead ReadEpoch(Client& client, const LoaderOptions& o, const ExpectedSamples& expected,
                    uint64_t max_batches = UINT64_MAX) {
  auto loader = client.OpenLoader(o);
  REQUIRE(loader.ok());
  EpochRead out;
  uint64_t n = 0;
  while (n++ < max_batches) {
    auto b = (*loader)->Next();
    if (!b.ok()) {
      REQUIRE(b.status().code() == StatusCode::kOutOfRange);
      break;
    }
    std::vector<uint64_t> ids;
    uint64_t pos = 0;
    for (size_t i = 0; i < b->size(); ++i) {
      const auto v = b->sample(i);
      const std::string got(reinterpret_cast<const char*>(v.data), v.size);
      REQUIRE(got == expected[b->sample_id(i)]);
      REQUIRE(v.data == b->data() + pos);  // back to back in batch order
      pos += v.size;
      ids.push_back(b->sample_id(i));
      out.all.push_back(b->sample_id(i));
    }
    REQUIRE(pos == b->payload_bytes());
    if ((*loader)->record_bytes() > 0) REQUIRE(b->record_bytes() == (*loader)->record_bytes());
    out.batches.push_back(std::move(ids));
  }
  return out;
}

}  // namespace shardcache::testing
