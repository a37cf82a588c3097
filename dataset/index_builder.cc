#include "dataset/index_builder.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <functional>

#include "common/hash.h"
#include "dataset/megatron_format.h"
#include "dataset/parallel_for.h"
#include "dataset/records_format.h"
#include "dataset/tar_format.h"

namespace shardcache::dataset {
namespace {

struct ShardResult {
  v1::SampleIndex samples;
  uint8_t dtype_code = 0;    // megatron
  std::string chunk_hashes;  // 16 bytes per chunk, filled by hashing tasks
};

Status IndexOneShard(const ShardStore& store, const ShardEntry& f, const IndexOptions& o, ShardResult* out) {
  const std::string abs = store.Describe(f.path);
  switch (o.format) {
    case v1::RECORDS: {
      SC_ASSIGN_OR_RETURN(out->samples, IndexRecordsShard(abs, f.size_bytes, o.record_bytes));
      return Status::Ok();
    }
    case v1::TAR: {
      SC_ASSIGN_OR_RETURN(auto src, store.OpenShard(f));
      SC_ASSIGN_OR_RETURN(out->samples, IndexTarShard(*src));
      return Status::Ok();
    }
    case v1::MEGATRON: {
      const std::string idx_abs = store.Describe(f.companion_path);
      SC_ASSIGN_OR_RETURN(std::string idx_bytes, store.ReadCompanion(f));
      SC_ASSIGN_OR_RETURN(MegatronIndex mi, ParseMegatronIndex(idx_bytes, idx_abs, f.size_bytes, abs));
      out->samples = std::move(mi.samples);
      out->dtype_code = mi.dtype_code;
      return Status::Ok();
    }
    default:
      return InvalidArgument("shard format must be records, tar or megatron");
  }
}

// Chunk hashes, one task per chunk across all shards, so one big shard still uses every core.
Status HashChunks(const ShardStore& store, const std::vector<ShardEntry>& shards, const IndexOptions& o,
                  unsigned threads, const BlockTableSink& tables, std::vector<ShardResult>* results) {
  const uint64_t chunk_bytes = o.chunk_bytes;
  // chunk_start[i] = first global chunk number of shard i.
  std::vector<uint64_t> chunk_start(shards.size() + 1, 0);
  uint64_t total_bytes = 0;
  for (size_t i = 0; i < shards.size(); ++i) {
    const uint64_t chunks = (shards[i].size_bytes + chunk_bytes - 1) / chunk_bytes;
    chunk_start[i + 1] = chunk_start[i] + chunks;
    (*results)[i].chunk_hashes.assign(chunks * 16, '\0');
    total_bytes += shards[i].size_bytes;
  }
  std::atomic<uint64_t> done_bytes{0};
  auto hash_chunk = [&](uint64_t global) -> Status {
    const size_t i = static_cast<size_t>(
        std::upper_bound(chunk_start.begin(), chunk_start.end(), global) - chunk_start.begin() - 1);
    const uint64_t chunk = global - chunk_start[i];
    const uint64_t offset = chunk * chunk_bytes;
    const uint64_t length = std::min(chunk_bytes, shards[i].size_bytes - offset);
    // One buffer per worker thread; the workers end with ParallelFor, freeing it.
    thread_local std::unique_ptr<char[]> buf;
    thread_local uint64_t buf_bytes = 0;
    if (buf_bytes < length) {
      buf.reset(new char[length]);
      buf_bytes = length;
    }
    SC_RETURN_IF_ERROR(store.ReadShard(shards[i], offset, length, buf.get()));
    const std::string table = BlockTable(buf.get(), length);
    if (tables) SC_RETURN_IF_ERROR(tables(i, chunk, table));
    const std::string h = RootOfBlockTable(table).ToBytes();
    // Tasks write disjoint 16-byte slots of a string sized before the workers started.
    std::memcpy((*results)[i].chunk_hashes.data() + chunk * 16, h.data(), 16);
    done_bytes.fetch_add(length, std::memory_order_relaxed);
    return Status::Ok();
  };
  std::function<void()> tick;
  if (o.progress) {
    tick = [&] { o.progress(done_bytes.load(std::memory_order_relaxed), total_bytes); };
  }
  return ParallelFor(chunk_start.back(), threads, hash_chunk, tick);
}

// The manifest of `shards` with their results (chunk hashes moved out of `results`).
Result<v1::Manifest> MakeManifest(const ShardStore& store, const std::vector<ShardEntry>& shards,
                                  const std::string& name, const IndexOptions& o,
                                  const std::vector<std::string>& index_hashes, std::vector<ShardResult>* results) {
  v1::Manifest m;
  m.set_format_version(kManifestFormatVersion);
  m.set_block_bytes(kChunkBlockBytes);
  m.set_name(name);
  m.set_format(o.format);
  m.set_chunk_bytes(o.chunk_bytes);
  if (o.format == v1::RECORDS) m.set_record_bytes(o.record_bytes);
  uint64_t total_samples = 0, total_bytes = 0;
  for (size_t i = 0; i < shards.size(); ++i) {
    ShardResult& r = (*results)[i];
    if (o.format == v1::MEGATRON) {
      if (m.megatron_dtype() == 0) {
        m.set_megatron_dtype(r.dtype_code);
        m.set_megatron_dtype_bytes(MegatronDtypeBytes(r.dtype_code));
      }
      if (m.megatron_dtype() != r.dtype_code) {
        return InvalidArgument(store.Describe(shards[i].companion_path) + ": dtype " +
                               MegatronDtypeName(r.dtype_code) + " differs from " +
                               MegatronDtypeName(static_cast<uint8_t>(m.megatron_dtype())) +
                               " of the first shard; a dataset has one token type");
      }
    }
    v1::Shard* s = m.add_shards();
    s->set_path(shards[i].path);
    s->set_size_bytes(shards[i].size_bytes);
    s->set_sample_count(static_cast<uint64_t>(r.samples.offsets_size()));
    s->set_chunk_hashes(std::move(r.chunk_hashes));
    s->set_companion_path(shards[i].companion_path);
    s->set_sample_index_hash(index_hashes[i]);
    total_samples += s->sample_count();
    total_bytes += shards[i].size_bytes;
  }
  m.set_total_samples(total_samples);
  m.set_total_bytes(total_bytes);
  return m;
}

}  // namespace

Status CheckIndexOptions(const IndexOptions& options) {
  if (options.chunk_bytes < kMinChunkBytes || options.chunk_bytes > kMaxChunkBytes) {
    return InvalidArgument("chunk size " + std::to_string(options.chunk_bytes) + " bytes is outside [" +
                           std::to_string(kMinChunkBytes) + ", " + std::to_string(kMaxChunkBytes) + "]");
  }
  if (options.format == v1::RECORDS && options.record_bytes == 0) {
    return InvalidArgument("records format needs a record size (--record-bytes)");
  }
  return Status::Ok();
}

Result<BuiltIndex> BuildIndex(const ShardStore& store, const std::vector<ShardEntry>& shards,
                              const std::string& name, const IndexOptions& options,
                              const BlockTableSink& tables) {
  SC_RETURN_IF_ERROR(CheckIndexOptions(options));
  const unsigned threads = DefaultThreads(options.threads);
  std::vector<ShardResult> results(shards.size());
  // Sample indexes, one task per shard; then the chunk hashes.
  SC_RETURN_IF_ERROR(ParallelFor(shards.size(), threads, [&](uint64_t i) {
    return IndexOneShard(store, shards[i], options, &results[i]);
  }));
  SC_RETURN_IF_ERROR(HashChunks(store, shards, options, threads, tables, &results));

  BuiltIndex out;
  out.sample_indexes.resize(shards.size());
  std::vector<std::string> index_hashes(shards.size());
  SC_RETURN_IF_ERROR(ParallelFor(shards.size(), threads, [&](uint64_t i) -> Status {
    v1::SampleIndex& samples = results[i].samples;
    samples.set_format_version(kSampleIndexFormatVersion);
    if (!samples.SerializeToString(&out.sample_indexes[i])) {
      return Internal(store.Describe(shards[i].path) + ": cannot serialize its sample index");
    }
    index_hashes[i] = HashBytes(out.sample_indexes[i]).ToBytes();
    return Status::Ok();
  }));
  SC_ASSIGN_OR_RETURN(v1::Manifest m, MakeManifest(store, shards, name, options, index_hashes, &results));
  if (!m.SerializeToString(&out.manifest_bytes)) {
    return Internal(store.Describe("") + ": cannot serialize the manifest");
  }
  return out;
}

}  // namespace shardcache::dataset
