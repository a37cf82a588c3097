#include "daemon/serve/batch_assembler.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <map>

#include "common/thread_name.h"
#include "daemon/serve/serve_metrics.h"

namespace shardcache::serve {
namespace {

// Niceness of reader threads relative to the rest of the daemon (see WorkerLoop).
constexpr int kReaderNice = 5;

}  // namespace

SampleLocator::SampleLocator(ChunkSource& source, DatasetPtr dataset)
    : source_(source), dataset_(std::move(dataset)) {
  const auto& m = dataset_->manifest;
  if (m.format() == v1::RECORDS && m.record_bytes() > 0) record_bytes_ = m.record_bytes();
  has_fields_ = m.format() == v1::TAR;
  first_id_.push_back(0);
  for (const auto& s : m.shards()) first_id_.push_back(first_id_.back() + s.sample_count());
  indexes_.resize(m.shards_size());
  loaded_ = std::make_unique<std::atomic<const ShardIndex*>[]>(indexes_.size());
  for (size_t i = 0; i < indexes_.size(); ++i) loaded_[i].store(nullptr, std::memory_order_relaxed);
}

Result<const SampleLocator::ShardIndex*> SampleLocator::IndexOf(uint32_t shard) {
  if (const ShardIndex* loaded = loaded_[shard].load(std::memory_order_acquire)) return loaded;
  // Loaded outside the lock: two loaders racing on one shard both parse it, one copy wins.
  SC_ASSIGN_OR_RETURN(std::string bytes, source_.GetSampleIndex(dataset_, shard));
  SC_ASSIGN_OR_RETURN(v1::SampleIndex idx,
                      dataset::ParseSampleIndex(bytes, dataset_->manifest, shard,
                                                "sample index of shard " + std::to_string(shard) +
                                                    " of '" + dataset_->name + "'"));
  auto si = std::make_unique<ShardIndex>();
  si->offsets.assign(idx.offsets().begin(), idx.offsets().end());
  si->lengths.assign(idx.lengths().begin(), idx.lengths().end());
  const auto& sh = dataset_->manifest.shards(shard);
  if (si->offsets.size() != sh.sample_count() || si->lengths.size() != sh.sample_count()) {
    return DataLoss("sample index of shard " + std::to_string(shard) + " of '" + dataset_->name +
                    "' lists " + std::to_string(si->offsets.size()) + " samples, manifest says " +
                    std::to_string(sh.sample_count()));
  }
  for (size_t i = 0; i < si->offsets.size(); ++i) {
    if (si->offsets[i] > sh.size_bytes() || si->lengths[i] > sh.size_bytes() - si->offsets[i]) {
      return DataLoss("sample " + std::to_string(i) + " of shard " + std::to_string(shard) +
                      " of '" + dataset_->name + "' lies outside the shard");
    }
  }
  if (has_fields_) SC_RETURN_IF_ERROR(LoadMembers(idx, shard, si.get()));
  MutexLock l(&mu_);
  if (!indexes_[shard]) {
    indexes_[shard] = std::move(si);
    loaded_[shard].store(indexes_[shard].get(), std::memory_order_release);
  }
  return indexes_[shard].get();
}

Status SampleLocator::LoadMembers(const v1::SampleIndex& idx, uint32_t shard, ShardIndex* si) const {
  const auto bad = [&](const std::string& why) {
    return DataLoss("sample index of shard " + std::to_string(shard) + " of '" + dataset_->name + "': " + why);
  };
  const size_t samples = si->offsets.size();
  const int members = idx.member_sample_size();
  if (idx.member_offset_size() != members || idx.member_length_size() != members ||
      idx.member_ext_size() != members) {
    return bad("member lists of different lengths");
  }
  if (static_cast<size_t>(idx.keys_size()) != samples) {
    return bad(std::to_string(idx.keys_size()) + " keys for " + std::to_string(samples) + " samples");
  }
  si->keys.assign(idx.keys().begin(), idx.keys().end());
  si->first_member.assign(samples + 1, 0);
  si->members.reserve(static_cast<size_t>(members));
  std::map<std::string, uint32_t> name_ids;
  uint32_t sample = 0;
  for (int k = 0; k < members; ++k) {
    const uint32_t owner = idx.member_sample(k);
    if (owner < sample || owner >= samples) return bad("member " + std::to_string(k) + " belongs to no sample in order");
    while (sample < owner) si->first_member[++sample] = static_cast<uint32_t>(si->members.size());
    const uint64_t off = idx.member_offset(k), len = idx.member_length(k);
    const uint64_t s0 = si->offsets[owner], s1 = s0 + si->lengths[owner];
    if (off < s0 || len > s1 - s0 || off - s0 > s1 - s0 - len) {
      return bad("member " + std::to_string(k) + " lies outside its sample " + std::to_string(owner));
    }
    auto [it, added] = name_ids.emplace(idx.member_ext(k), static_cast<uint32_t>(si->names.size()));
    if (added) si->names.push_back(idx.member_ext(k));
    si->members.push_back({off - s0, len, it->second});
  }
  while (sample < samples) si->first_member[++sample] = static_cast<uint32_t>(si->members.size());
  return Status::Ok();
}

Result<std::pair<uint32_t, uint64_t>> SampleLocator::ShardOf(uint64_t sample_id) const {
  if (sample_id >= total_samples()) {
    return OutOfRange("sample " + std::to_string(sample_id) + " is past the end of '" +
                      dataset_->name + "' (" + std::to_string(total_samples()) + " samples)");
  }
  const auto it = std::upper_bound(first_id_.begin(), first_id_.end(), sample_id);
  const uint32_t shard = static_cast<uint32_t>(it - first_id_.begin() - 1);
  return std::make_pair(shard, sample_id - first_id_[shard]);
}

Status SampleLocator::LoadIndexesOf(std::span<const uint64_t> ids) {
  if (record_bytes_ > 0) return Status::Ok();
  std::vector<uint32_t> missing;
  for (const uint64_t id : ids) {
    auto at = ShardOf(id);
    if (at.ok() && loaded_[at->first].load(std::memory_order_acquire) == nullptr) missing.push_back(at->first);
  }
  std::sort(missing.begin(), missing.end());
  missing.erase(std::unique(missing.begin(), missing.end()), missing.end());
  if (missing.size() < 2) return Status::Ok();  // Locate loads a single one itself
  std::atomic<size_t> next{0};
  Mutex error_mu;
  Status first_error;
  auto load = [&] {
    for (size_t k; (k = next.fetch_add(1)) < missing.size();) {
      auto r = IndexOf(missing[k]);
      if (r.ok()) continue;
      MutexLock l(&error_mu);
      if (first_error.ok()) first_error = r.status();
    }
  };
  std::vector<std::thread> loaders;
  const size_t threads = std::min(missing.size(), kParallelIndexLoads);
  for (size_t i = 1; i < threads; ++i) loaders.emplace_back(load);
  load();
  for (auto& t : loaders) t.join();
  MutexLock l(&error_mu);
  return first_error;
}

Result<SampleLocator::Extent> SampleLocator::Locate(uint64_t sample_id) {
  SC_ASSIGN_OR_RETURN(auto at, ShardOf(sample_id));
  const auto [shard, local] = at;
  if (record_bytes_ > 0) return Extent{shard, local * record_bytes_, record_bytes_};
  SC_ASSIGN_OR_RETURN(auto idx, IndexOf(shard));
  return Extent{shard, idx->offsets[local], idx->lengths[local]};
}

Status SampleLocator::AppendFields(uint64_t sample_id, uint64_t payload_offset, FieldsBuilder* out) {
  if (!has_fields_) return FailedPrecondition("samples of '" + dataset_->name + "' have no fields (not a tar dataset)");
  SC_ASSIGN_OR_RETURN(auto at, ShardOf(sample_id));
  const uint64_t local = at.second;
  SC_ASSIGN_OR_RETURN(auto idx, IndexOf(at.first));
  sample_fields::SampleFields sf{};
  sf.key_offset = static_cast<uint32_t>(out->names_.size());
  sf.key_length = static_cast<uint32_t>(idx->keys[local].size());
  out->names_ += idx->keys[local];
  sf.first_member = static_cast<uint32_t>(out->members_.size());
  sf.member_count = idx->first_member[local + 1] - idx->first_member[local];
  for (uint32_t k = idx->first_member[local]; k < idx->first_member[local + 1]; ++k) {
    const ShardIndex::Member& m = idx->members[k];
    out->members_.push_back({payload_offset + m.offset, m.length, out->NameOffset(idx->names[m.name]),
                             static_cast<uint32_t>(idx->names[m.name].size())});
  }
  out->samples_.push_back(sf);
  return Status::Ok();
}

uint32_t SampleLocator::FieldsBuilder::NameOffset(const std::string& name) {
  // A batch has a handful of member names: each is stored once, found by a short scan.
  for (const auto& [n, at] : name_offsets_) {
    if (n == &name) return at;
  }
  uint32_t at = UINT32_MAX;
  for (const auto& [n, offset] : name_offsets_) {
    if (*n == name) at = offset;  // the same name in another shard's index
  }
  if (at == UINT32_MAX) {
    at = static_cast<uint32_t>(names_.size());
    names_ += name;
  }
  name_offsets_.emplace_back(&name, at);
  return at;
}

void SampleLocator::FieldsBuilder::WriteTo(uint8_t* dest) const {
  sample_fields::FieldsHeader h{};
  h.magic = sample_fields::kMagic;
  h.layout_version = sample_fields::kLayoutVersion;
  h.samples = static_cast<uint32_t>(samples_.size());
  h.members = static_cast<uint32_t>(members_.size());
  h.names_bytes = names_.size();
  std::memcpy(dest, &h, sizeof h);
  dest += sizeof h;
  std::memcpy(dest, samples_.data(), samples_.size() * sizeof(samples_[0]));
  dest += samples_.size() * sizeof(samples_[0]);
  std::memcpy(dest, members_.data(), members_.size() * sizeof(members_[0]));
  dest += members_.size() * sizeof(members_[0]);
  std::memcpy(dest, names_.data(), names_.size());
}

BatchAssembler::BatchAssembler(ChunkSource& source, BatchAssemblerOptions options)
    : source_(source), options_(options) {
  const uint32_t n = std::max<uint32_t>(1, options_.read_threads);
  for (uint32_t i = 0; i < n; ++i) {
    workers_.emplace_back([this] {
      NameThisThread("sc-assemble");
      WorkerLoop();
    });
  }
}

BatchAssembler::~BatchAssembler() {
  {
    MutexLock l(&mu_);
    stop_ = true;
  }
  work_.NotifyAll();
  for (auto& t : workers_) t.join();
}

void BatchAssembler::Submit(std::function<void()> task, bool demand) {
  {
    MutexLock l(&mu_);
    (demand ? demand_ : warm_).push_back(std::move(task));
  }
  work_.NotifyOne();
}

void BatchAssembler::WorkerLoop() {
  // Readers yield the CPU to the threads that answer trainers (a node with a few cores runs
  // dozens of readers; a NextBatch answer that waits behind them is time a trainer stalls).
  // Linux nice is per thread; failure (e.g. a seccomp filter) only costs that preference.
  (void)setpriority(PRIO_PROCESS, static_cast<id_t>(::gettid()), kReaderNice);
  for (;;) {
    std::function<void()> task;
    {
      MutexLock l(&mu_);
      work_.Wait(&mu_, [&]() REQUIRES(mu_) { return stop_ || !demand_.empty() || !warm_.empty(); });
      // Drain queued work before stopping so no Assemble() waits forever.
      if (!demand_.empty()) {
        task = std::move(demand_.front());
        demand_.pop_front();
      } else if (!warm_.empty()) {
        task = std::move(warm_.front());
        warm_.pop_front();
      } else {
        return;
      }
    }
    task();
  }
}

bool BatchAssembler::TakeWarmSlot() {
  MutexLock l(&mu_);
  const uint32_t cap = std::min(options_.max_warm_inflight, std::max<uint32_t>(1, options_.read_threads / 4 * 3));
  if (stop_ || warm_inflight_ >= cap) return false;
  ++warm_inflight_;
  return true;
}

void BatchAssembler::ReleaseWarmSlot() {
  MutexLock l(&mu_);
  --warm_inflight_;
}

ReadOptions BatchAssembler::WarmReadOptions() const {
  ReadOptions ro;
  ro.priority = FetchPriority::kPrefetch;
  ro.deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(options_.read_timeout_ms);
  return ro;
}

bool BatchAssembler::TryWarm(const DatasetPtr& dataset, uint32_t shard, uint64_t first, uint64_t count,
                             std::function<bool()> still_wanted) {
  // Chunks some tier holds need no warm read, and no reader thread: handing them over would
  // cost two context switches for nothing.
  if (source_.Holds(dataset, shard, first, count)) return true;
  if (!TakeWarmSlot()) return false;
  Submit(
      [this, dataset, shard, first, count, still_wanted = std::move(still_wanted)] {
        if (!still_wanted || still_wanted()) {
          // A failed warm-up is not an error: the demand read will retry and report it.
          if (source_.Prefetch(dataset, shard, first, count, WarmReadOptions()).ok()) {
            ServeMetrics::Get().warm_reads->Add(count);
          }
        }
        ReleaseWarmSlot();
      },
      /*demand=*/false);
  return true;
}

bool BatchAssembler::TryWarmPieces(const DatasetPtr& dataset, uint32_t shard, std::vector<ChunkPiece> pieces,
                                   std::function<bool()> still_wanted, std::function<void(uint64_t)> landed) {
  uint64_t bytes = 0;
  for (const ChunkPiece& p : pieces) bytes += p.length;
  if (source_.HoldsPieces(dataset, shard, pieces)) {
    landed(bytes);
    return true;
  }
  if (!TakeWarmSlot()) return false;
  Submit(
      [this, dataset, shard, bytes, pieces = std::move(pieces), still_wanted = std::move(still_wanted),
       landed = std::move(landed)]() mutable {
        uint64_t told = 0;
        if (!still_wanted || still_wanted()) {
          // Only the tiers want the pieces: a cache lands them straight in the runs it keeps
          // (keep_only); a source that keeps nothing needs somewhere to put them.
          ReadOptions ro = WarmReadOptions();
          ro.whole_chunks = false;
          ro.keep_only = source_.CapacityBytes() > 0;
          std::unique_ptr<uint8_t[]> scratch;
          if (!ro.keep_only) {
            scratch = std::make_unique_for_overwrite<uint8_t[]>(bytes);
            uint64_t at = 0;
            for (ChunkPiece& p : pieces) {
              p.dest = scratch.get() + at;
              at += p.length;
            }
          }
          ro.piece_done = [&](size_t i) {
            landed(pieces[i].length);
            told += pieces[i].length;
          };
          // A failed warm-up is not an error: the demand read will retry and report it.
          if (source_.ReadPieces(dataset, shard, pieces, ro).ok()) ServeMetrics::Get().warm_reads->Add(pieces.size());
        }
        ReleaseWarmSlot();
        landed(bytes - told);  // the rest: held already, dropped, or failed
      },
      /*demand=*/false);
  return true;
}

uint32_t BatchAssembler::warm_inflight() const {
  MutexLock l(&mu_);
  return warm_inflight_;
}

// Contiguous chunks of one shard a batch needs, with the pieces to copy out of them: one
// ReadPieces call (one upstream range on a miss).
struct BatchAssembler::PieceRun {
  uint32_t shard;
  uint64_t first;
  uint64_t count;
  std::vector<ChunkPiece> pieces;
};

Status BatchAssembler::Plan(SampleLocator& locator, std::span<const uint64_t> ids, uint8_t* dest,
                            uint64_t dest_bytes, bool fields, AssembledBatch* out, std::vector<PieceRun>* runs) {
  const DatasetPtr& ds = locator.dataset();
  const uint64_t chunk_bytes = ds->manifest.chunk_bytes();
  out->sample_ids.assign(ids.begin(), ids.end());
  out->offsets.resize(ids.size());
  out->lengths.resize(ids.size());
  std::vector<SampleLocator::Extent> ext(ids.size());
  SC_RETURN_IF_ERROR(locator.LoadIndexesOf(ids));
  uint64_t pos = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    SC_ASSIGN_OR_RETURN(ext[i], locator.Locate(ids[i]));
    out->offsets[i] = pos;
    out->lengths[i] = ext[i].length;
    pos += ext[i].length;
  }
  out->payload_bytes = pos;
  SampleLocator::FieldsBuilder table;
  uint64_t needed = pos;
  if (fields && locator.has_fields()) {
    table.Reserve(ids.size());
    for (size_t i = 0; i < ids.size(); ++i) SC_RETURN_IF_ERROR(locator.AppendFields(ids[i], out->offsets[i], &table));
    out->fields_offset = sample_fields::TableOffset(pos);
    out->fields_bytes = table.bytes();
    needed = out->fields_offset + out->fields_bytes;
  }
  if (needed > dest_bytes) {
    return ResourceExhausted("batch of " + std::to_string(ids.size()) + " samples of '" +
                             ds->name + "' needs " + std::to_string(needed) +
                             " bytes but an arena slot holds " + std::to_string(dest_bytes) +
                             "; use a smaller batch or larger slots (fewer slots or a bigger arena)");
  }
  if (out->fields_bytes > 0) table.WriteTo(dest + out->fields_offset);
  // The piece of each sample inside each chunk it overlaps, grouped by (shard, chunk); the
  // source copies every piece straight to its place in the slot.
  std::map<std::pair<uint32_t, uint64_t>, std::vector<ChunkPiece>> by_chunk;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ext[i].length == 0) continue;
    const uint64_t s_end = ext[i].offset + ext[i].length;
    for (uint64_t c = ext[i].offset / chunk_bytes; c * chunk_bytes < s_end; ++c) {
      const uint64_t s0 = std::max(ext[i].offset, c * chunk_bytes);
      const uint64_t s1 = std::min(s_end, (c + 1) * chunk_bytes);
      by_chunk[{ext[i].shard, c}].push_back(
          ChunkPiece{c, s0 - c * chunk_bytes, s1 - s0, dest + out->offsets[i] + (s0 - ext[i].offset)});
    }
  }
  for (auto& [key, pieces] : by_chunk) {
    if (runs->empty() || runs->back().shard != key.first ||
        runs->back().first + runs->back().count != key.second) {
      runs->push_back({key.first, key.second, 0, {}});
    }
    ++runs->back().count;
    runs->back().pieces.insert(runs->back().pieces.end(), pieces.begin(), pieces.end());
  }
  out->chunks_read = by_chunk.size();
  return Status::Ok();
}

void BatchAssembler::AssembleAsync(SampleLocator& locator, std::vector<uint64_t> ids, uint8_t* dest,
                                   uint64_t dest_bytes, AssembleDone done, bool fields, bool whole_chunks) {
  struct Job {
    DatasetPtr dataset;
    AssembledBatch out;
    std::vector<PieceRun> runs;
    ReadOptions options;
    AssembleDone done;
    Mutex mu;
    size_t pending = 0;
    Status first_error;
  };
  auto job = std::make_shared<Job>();
  job->dataset = locator.dataset();
  job->done = std::move(done);
  Status planned = Plan(locator, ids, dest, dest_bytes, fields, &job->out, &job->runs);
  if (!planned.ok() || job->runs.empty()) {
    job->done(planned, std::move(job->out));
    return;
  }
  job->options.priority = FetchPriority::kDemand;
  job->options.whole_chunks = whole_chunks;
  job->options.deadline =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(options_.read_timeout_ms);
  // Runs whose chunks are all in memory are copied right here: the copy costs less than the
  // two context switches of a handoff to a reader thread, and a warm cache serves every batch
  // this way. The rest are read in parallel on the pool; the last one to finish reports the
  // batch.
  std::vector<size_t> to_read;
  for (size_t i = 0; i < job->runs.size(); ++i) {
    const PieceRun& r = job->runs[i];
    if (source_.ReadPiecesFromMemory(job->dataset, r.shard, r.pieces, FetchPriority::kDemand)) {
      ServeMetrics::Get().chunk_reads->Add(r.count);
    } else {
      to_read.push_back(i);
    }
  }
  if (to_read.empty()) {
    job->done(Status::Ok(), std::move(job->out));
    return;
  }
  job->pending = to_read.size();
  for (size_t i : to_read) {
    Submit(
        [this, job, i] {
          const PieceRun& r = job->runs[i];
          Status s = source_.ReadPieces(job->dataset, r.shard, r.pieces, job->options);
          if (s.ok()) ServeMetrics::Get().chunk_reads->Add(r.count);
          {
            MutexLock l(&job->mu);
            if (!s.ok() && job->first_error.ok()) job->first_error = s;
            if (--job->pending > 0) return;
          }
          job->done(job->first_error, std::move(job->out));
        },
        /*demand=*/true);
  }
}

}  // namespace shardcache::serve
