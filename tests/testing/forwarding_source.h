// ForwardingSource: a ChunkSource that hands every call to another one. Test sources that
// delay, fail, gate or corrupt reads derive from it and override only what they change.
#pragma once

#include <string>
#include <vector>

#include "daemon/source/chunk_source.h"

namespace shardcache::testing {

class ForwardingSource : public ChunkSource {
 public:
  explicit ForwardingSource(ChunkSource& inner) : inner_(inner) {}
  Result<std::vector<v1::DatasetSummary>> ListDatasets() override { return inner_.ListDatasets(); }
  Result<DatasetPtr> OpenDataset(const std::string& name) override { return inner_.OpenDataset(name); }
  Result<std::string> GetSampleIndex(const DatasetPtr& dataset, uint32_t shard) override {
    return inner_.GetSampleIndex(dataset, shard);
  }
  Status ReadChunks(const DatasetPtr& dataset, uint32_t shard, uint64_t first, uint64_t count,
                    const ReadOptions& options, const ChunkSink& sink) override {
    return inner_.ReadChunks(dataset, shard, first, count, options, sink);
  }

 protected:
  ChunkSource& inner_;
};

}  // namespace shardcache::testing
