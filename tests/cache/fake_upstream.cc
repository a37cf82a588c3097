#include "tests/cache/fake_upstream.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

namespace shardcache::testing {

void FillSyntheticChunk(uint64_t seed, uint32_t shard, uint64_t chunk, uint8_t* out, size_t length) {
  uint64_t x = seed * 0x9E3779B97F4A7C15ull ^ (uint64_t{shard} << 40) ^ (chunk * 0xBF58476D1CE4E5B9ull) ^ 0x1234567ull;
  size_t i = 0;
  for (; i + 8 <= length; i += 8) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    std::memcpy(out + i, &x, 8);
  }
  for (; i < length; ++i) out[i] = static_cast<uint8_t>(x >> (8 * (i % 8)));
}

DatasetPtr MakeSyntheticDataset(const SyntheticDatasetOptions& o) {
  v1::Manifest m;
  m.set_format_version(dataset::kManifestFormatVersion);
  m.set_block_bytes(kChunkBlockBytes);
  m.set_name(o.name);
  m.set_format(v1::RECORDS);
  m.set_chunk_bytes(o.chunk_bytes);
  m.set_record_bytes(o.record_bytes);
  AlignedBuffer buf(o.chunk_bytes);
  for (uint32_t s = 0; s < o.shards; ++s) {
    auto* shard = m.add_shards();
    shard->set_path("shard-" + std::to_string(s) + ".bin");
    shard->set_size_bytes(o.shard_bytes);
    shard->set_sample_count(o.shard_bytes / o.record_bytes);
    std::string hashes;
    const uint64_t chunks = (o.shard_bytes + o.chunk_bytes - 1) / o.chunk_bytes;
    for (uint64_t c = 0; c < chunks; ++c) {
      const uint64_t len = std::min(o.chunk_bytes, o.shard_bytes - c * o.chunk_bytes);
      FillSyntheticChunk(o.seed, s, c, buf.data(), len);
      hashes += ChunkDigest(buf.data(), len).ToBytes();
    }
    shard->set_chunk_hashes(hashes);
  }
  m.set_total_samples(uint64_t{o.shards} * (o.shard_bytes / o.record_bytes));
  m.set_total_bytes(uint64_t{o.shards} * o.shard_bytes);
  std::string bytes;
  m.SerializeToString(&bytes);
  auto ds = dataset::MakeDataset(bytes, "synthetic dataset " + o.name);
  if (!ds.ok()) {
    std::fprintf(stderr, "MakeSyntheticDataset: %s\n", ds.status().ToString().c_str());
    std::abort();
  }
  return *ds;
}

ChunkPtr MakeSyntheticChunk(const SyntheticDatasetOptions& o, const DatasetPtr& d, uint32_t shard, uint64_t chunk) {
  const uint64_t len = dataset::ChunkLength(d->manifest, shard, chunk);
  auto c = std::make_shared<Chunk>();
  c->bytes = AlignedBuffer(len);
  FillSyntheticChunk(o.seed, shard, chunk, c->bytes.data(), len);
  c->hash = ChunkDigest(c->bytes.data(), len);
  return c;
}

void FakeUpstream::AddDataset(const SyntheticDatasetOptions& options, DatasetPtr dataset) {
  std::lock_guard<std::mutex> lock(mu_);
  const std::string name = dataset->name;
  datasets_[name] = Entry{options, std::move(dataset)};
}

Result<std::vector<v1::DatasetSummary>> FakeUpstream::ListDatasets() {
  if (fail) return Unavailable("fake upstream is down");
  std::vector<v1::DatasetSummary> out;
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [name, e] : datasets_) out.push_back(SummarizeDataset(*e.dataset));
  return out;
}

Result<DatasetPtr> FakeUpstream::OpenDataset(const std::string& name) {
  if (fail) return Unavailable("fake upstream is down");
  std::lock_guard<std::mutex> lock(mu_);
  auto it = datasets_.find(name);
  if (it == datasets_.end()) return NotFound("no dataset '" + name + "'");
  return it->second.dataset;
}

Result<std::string> FakeUpstream::GetSampleIndex(const DatasetPtr& dataset, uint32_t shard) {
  if (fail) return Unavailable("fake upstream is down");
  v1::SampleIndex idx;
  idx.set_format_version(dataset::kSampleIndexFormatVersion);
  const auto& s = dataset->manifest.shards(static_cast<int>(shard));
  for (uint64_t i = 0; i < s.sample_count(); ++i) {
    idx.add_offsets(i * dataset->manifest.record_bytes());
    idx.add_lengths(dataset->manifest.record_bytes());
  }
  return idx.SerializeAsString();
}

Status FakeUpstream::ReadChunks(const DatasetPtr& dataset, uint32_t shard, uint64_t first, uint64_t count,
                                const ReadOptions& options, const ChunkSink& sink) {
  calls.fetch_add(1);
  SC_RETURN_IF_ERROR(CheckChunkRange(dataset, shard, first, count));
  if (fail) return Unavailable("fake upstream is down");
  if (stall) {
    while (stall && std::chrono::steady_clock::now() < options.deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    if (std::chrono::steady_clock::now() >= options.deadline) {
      return DeadlineExceeded("fake upstream stalled past the deadline");
    }
  }
  if (uint32_t d = delay_ms.load()) std::this_thread::sleep_for(std::chrono::milliseconds(d));
  SyntheticDatasetOptions o;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = datasets_.find(dataset->name);
    if (it == datasets_.end() || it->second.dataset->version != dataset->version) {
      return NotFound("fake upstream has no version " + dataset->version + " of '" + dataset->name + "'");
    }
    o = it->second.options;
  }
  for (uint64_t c = first; c < first + count; ++c) {
    if (fail) return Unavailable("fake upstream went down mid-stream");
    auto chunk = MakeSyntheticChunk(o, dataset, shard, c);
    uint32_t n = corrupt_next.load();
    while (n > 0 && !corrupt_next.compare_exchange_weak(n, n - 1)) {}
    if (n > 0) const_cast<uint8_t*>(chunk->bytes.data())[chunk->bytes.size() / 2] ^= 0x5a;
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++fetches_[{shard, c}];
    }
    chunks_sent.fetch_add(1);
    bytes_sent.fetch_add(chunk->bytes.size());
    SC_RETURN_IF_ERROR(sink(c, chunk));
  }
  return Status::Ok();
}

uint64_t FakeUpstream::FetchCount(uint32_t shard, uint64_t chunk) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = fetches_.find({shard, chunk});
  return it == fetches_.end() ? 0 : it->second;
}

}  // namespace shardcache::testing

