#include "daemon/upstream/object_source.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <unordered_map>

#include <spdlog/spdlog.h>

#include "common/log.h"
#include "common/metrics.h"
#include "dataset/dataset_name.h"
#include "objstore/objstore_metrics.h"

namespace shardcache::upstream {
namespace {

const std::string kManifestTail = std::string("/") + dataset::kMetaDirName + "/manifest.pb";

}  // namespace

Result<std::unique_ptr<ObjectSource>> ObjectSource::Open(const std::string& uri,
                                                         const objstore::ObjectStoreOptions& options) {
  SC_ASSIGN_OR_RETURN(objstore::ObjectUri parsed, objstore::ParseObjectUri(uri));
  SC_ASSIGN_OR_RETURN(auto client, objstore::ObjectClient::Open(parsed, options));
  objstore::ChecksumFailuresCounter();  // the family exists, at zero, from the start
  return std::unique_ptr<ObjectSource>(new ObjectSource(std::move(client)));
}

std::string ObjectSource::DatasetKey(const std::string& name, const std::string& relative) const {
  return client_->uri().Key(name + "/" + relative);
}

Result<std::vector<v1::DatasetSummary>> ObjectSource::ListDatasets() {
  const std::string prefix = client_->uri().prefix.empty() ? "" : client_->uri().prefix + "/";
  SC_ASSIGN_OR_RETURN(std::vector<objstore::ObjectInfo> objects, client_->List(prefix));
  std::vector<v1::DatasetSummary> out;
  for (const auto& o : objects) {
    if (o.key.size() <= prefix.size() + kManifestTail.size() ||
        o.key.compare(o.key.size() - kManifestTail.size(), kManifestTail.size(), kManifestTail) != 0) {
      continue;
    }
    const std::string name = o.key.substr(prefix.size(), o.key.size() - prefix.size() - kManifestTail.size());
    if (!CheckDatasetName(name).ok()) continue;
    auto d = OpenDataset(name);
    if (d.ok()) {
      out.push_back(SummarizeDataset(**d));
    } else {
      SC_LOG_RATE_LIMITED(spdlog::level::warn, "skipping dataset '{}': {}", name, d.status().ToString());
    }
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.name() < b.name(); });
  return out;
}

Result<std::vector<objstore::ObjectStat>> ObjectSource::StatShards(const dataset::Dataset& d) {
  const auto& m = d.manifest;
  std::vector<std::string> keys;
  for (int i = 0; i < m.shards_size(); ++i) keys.push_back(DatasetKey(d.name, m.shards(i).path()));
  std::vector<Result<objstore::ObjectStat>> stats;
  if (client_->uri().is_s3()) {
    // One listing (a request per 1000 keys) instead of a HEAD per shard.
    SC_ASSIGN_OR_RETURN(auto objects, client_->List(DatasetKey(d.name, "")));
    std::unordered_map<std::string, objstore::ObjectStat> listed;
    for (auto& o : objects) listed.emplace(o.key, objstore::ObjectStat{o.size, o.etag});
    for (const auto& key : keys) {
      auto it = listed.find(key);
      if (it != listed.end()) stats.emplace_back(it->second);
      else stats.emplace_back(NotFound(client_->uri().Describe(key) + " does not exist at " + client_->endpoint()));
    }
  } else {
    stats = client_->StatMany(keys);  // concurrent HEADs: no listing over plain http(s)
  }
  std::vector<objstore::ObjectStat> out;
  for (int i = 0; i < m.shards_size(); ++i) {
    Result<objstore::ObjectStat>& st = stats[static_cast<size_t>(i)];
    if (!st.ok()) {
      return st.status().WithContext("shard " + std::to_string(i) + " of dataset '" + d.name + "'");
    }
    if (st->size != m.shards(i).size_bytes()) {
      return DataLoss(client_->uri().Describe(keys[static_cast<size_t>(i)]) + " (shard " + std::to_string(i) +
                      " of dataset '" + d.name + "') is " + std::to_string(st->size) + " bytes; its manifest says " +
                      std::to_string(m.shards(i).size_bytes()) + " — re-index the dataset");
    }
    out.push_back(std::move(*st));
  }
  return out;
}

Result<DatasetPtr> ObjectSource::OpenDataset(const std::string& name) {
  SC_RETURN_IF_ERROR(CheckDatasetName(name));
  const std::string key = DatasetKey(name, std::string(dataset::kMetaDirName) + "/manifest.pb");
  auto st = client_->Stat(key);
  if (!st.ok()) {
    if (st.status().code() != StatusCode::kNotFound) return st.status();
    return NotFound("dataset '" + name + "' not found: " + st.status().message());
  }
  {
    MutexLock lock(&mu_);
    auto it = loaded_.find(name);
    if (it != loaded_.end() && !st->etag.empty() && it->second->manifest_etag == st->etag) {
      return it->second->dataset;
    }
  }
  SC_ASSIGN_OR_RETURN(objstore::ObjectBytes manifest, client_->Get(key));
  const std::string where = client_->uri().Describe(key);
  SC_ASSIGN_OR_RETURN(DatasetPtr d, dataset::MakeDataset(std::move(manifest.bytes), where, name));
  SC_ASSIGN_OR_RETURN(std::vector<objstore::ObjectStat> shards, StatShards(*d));
  auto loaded = std::make_shared<Loaded>(Loaded{d, manifest.etag, std::move(shards)});
  MutexLock lock(&mu_);
  LoadedPtr& slot = loaded_[name];
  if (slot && slot->dataset->version != d->version) {
    spdlog::info("dataset '{}' changed: version {} -> {}", name, slot->dataset->version, d->version);
  }
  slot = std::move(loaded);
  return d;
}

Result<std::string> ObjectSource::GetSampleIndex(const DatasetPtr& d, uint32_t shard) {
  SC_RETURN_IF_ERROR(CheckDatasetName(d->name));
  if (shard >= static_cast<uint32_t>(d->manifest.shards_size())) {
    return InvalidArgument("dataset '" + d->name + "' has " + std::to_string(d->manifest.shards_size()) +
                           " shards; shard " + std::to_string(shard) + " does not exist");
  }
  const std::string key =
      DatasetKey(d->name, std::string(dataset::kMetaDirName) + "/samples/" + std::to_string(shard) + ".pb");
  SC_ASSIGN_OR_RETURN(objstore::ObjectBytes index, client_->Get(key));
  auto parsed = dataset::ParseSampleIndex(index.bytes, d->manifest, shard, client_->uri().Describe(key));
  if (!parsed.ok()) return parsed.status();
  return std::move(index.bytes);
}

objstore::ObjectStat ObjectSource::ShardState(const DatasetPtr& d, uint32_t shard) {
  {
    MutexLock lock(&mu_);
    auto it = loaded_.find(d->name);
    if (it != loaded_.end() && it->second->dataset->version == d->version && shard < it->second->shards.size()) {
      return it->second->shards[shard];
    }
  }
  // A version this source did not load (or no longer holds): the size still pins the object,
  // the chunk hashes catch any other change.
  return objstore::ObjectStat{d->manifest.shards(static_cast<int>(shard)).size_bytes(), ""};
}

Status ObjectSource::Deliver(const DatasetPtr& d, uint32_t shard, uint64_t c, const std::string& object,
                             std::shared_ptr<Chunk> chunk, const ChunkSink& sink) {
  const auto& m = d->manifest;
  const size_t len = chunk->bytes.size();
  chunk->hash = ChunkDigest(chunk->bytes.data(), len);
  const Hash128 want = dataset::ChunkHash(m, shard, c);
  if (chunk->hash != want) {
    objstore::ChecksumFailuresCounter()->Add();
    const std::string msg = object + " (dataset '" + d->name + "', shard " + std::to_string(shard) + ", chunk " +
                            std::to_string(c) + ", offset " + std::to_string(c * m.chunk_bytes()) + ", " +
                            std::to_string(len) + " bytes): xxh3-128 is " + chunk->hash.ToHex() +
                            ", the manifest says " + want.ToHex();
    SC_LOG_RATE_LIMITED(spdlog::level::err, "corrupt chunk: {}", msg);
    return DataLoss(msg);
  }
  return sink(c, chunk);
}

namespace {

using ChunkBuffer = std::shared_ptr<Chunk>;

// Completed reads of one ReadChunks call, by chunk index. Shared with the reads' completions,
// which may outlive the call (it returns early on an error or its deadline); each completion
// also holds the buffer its read writes into.
struct Arrivals {
  Mutex mu;
  CondVar cv;
  std::map<uint64_t, Result<ChunkBuffer>> done GUARDED_BY(mu);
  // Chunks whose parts are still arriving: parts left, the first part's error.
  std::map<uint64_t, std::pair<uint64_t, Status>> partial GUARDED_BY(mu);
};

// Waits for chunk `c`'s read until `deadline`; DeadlineExceeded naming `object` after it.
Result<ChunkBuffer> AwaitChunk(Arrivals& a, uint64_t c, std::chrono::steady_clock::time_point deadline,
                               const std::string& object) {
  MutexLock lock(&a.mu);
  const bool arrived = a.cv.WaitUntil(&a.mu, deadline, [&]() REQUIRES(a.mu) { return a.done.count(c) > 0; });
  if (!arrived) return DeadlineExceeded("reading chunk " + std::to_string(c) + " of " + object + ": deadline passed");
  auto it = a.done.find(c);
  Result<ChunkBuffer> r = std::move(it->second);
  a.done.erase(it);
  return r;
}

}  // namespace

Status ObjectSource::ReadChunks(const DatasetPtr& d, uint32_t shard, uint64_t first, uint64_t count,
                                const ReadOptions& options, const ChunkSink& sink) {
  SC_RETURN_IF_ERROR(CheckDatasetName(d->name));
  SC_RETURN_IF_ERROR(CheckChunkRange(d, shard, first, count));
  const auto& m = d->manifest;
  const std::string key = DatasetKey(d->name, m.shards(static_cast<int>(shard)).path());
  const std::string object = client_->uri().Describe(key);
  const objstore::ObjectStat state = ShardState(d, shard);
  auto arrivals = std::make_shared<Arrivals>();
  const uint64_t end = first + count;
  uint64_t next_read = first;
  // A sliding window: chunk c + kReadWindowChunks is requested as chunk c is handed out, so the
  // connections stay busy while the sink works, and chunks still go out in order.
  for (uint64_t c = first; c < end; ++c) {
    for (; next_read < end && next_read < c + kReadWindowChunks; ++next_read) {
      const uint64_t i = next_read;
      // The bytes land in the chunk's own aligned buffer: no copy between the socket and it.
      auto chunk = std::make_shared<Chunk>();
      chunk->bytes = AlignedBuffer(dataset::ChunkLength(m, shard, i));
      // A chunk is read as parts of kReadPartBytes on their own connections: one connection
      // carries at most its window per RTT, so whole chunks would need chunk-sized bytes in
      // flight per connection to fill a long link (and the last chunk alone is a long tail).
      const uint64_t len = chunk->bytes.size();
      const uint64_t parts = std::max<uint64_t>(1, (len + kReadPartBytes - 1) / kReadPartBytes);
      {
        MutexLock lock(&arrivals->mu);
        arrivals->partial[i] = {parts, Status::Ok()};
      }
      for (uint64_t p = 0; p < parts; ++p) {
        const uint64_t off = p * kReadPartBytes;
        objstore::RangeRead read{key,        i * m.chunk_bytes() + off, std::min(kReadPartBytes, len - off),
                                 state.etag, state.size,                chunk->bytes.data() + off,
                                 options.priority == FetchPriority::kDemand};
        client_->ReadRangeAsync(read, [arrivals, i, chunk](Result<std::string> r) {
          MutexLock lock(&arrivals->mu);
          auto& [left, error] = arrivals->partial[i];
          if (!r.ok() && error.ok()) error = r.status();
          if (--left > 0) return;
          Status e = std::move(error);
          arrivals->partial.erase(i);
          arrivals->done.emplace(i, e.ok() ? Result<ChunkBuffer>(chunk) : Result<ChunkBuffer>(e));
          arrivals->cv.NotifyAll();
        });
      }
    }
    Result<ChunkBuffer> r = AwaitChunk(*arrivals, c, options.deadline, object);
    if (!r.ok()) {
      return r.status().WithContext("dataset '" + d->name + "' shard " + std::to_string(shard) + " chunk " +
                                    std::to_string(c));
    }
    SC_RETURN_IF_ERROR(Deliver(d, shard, c, object, std::move(*r), sink));
  }
  return Status::Ok();
}

}  // namespace shardcache::upstream
