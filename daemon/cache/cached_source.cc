#include "daemon/cache/cached_source.h"

#include <algorithm>
#include <unordered_map>
#include <cstring>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "common/log.h"
#include "common/units.h"
#include "daemon/cache/cache_metrics.h"

namespace shardcache::cache {
namespace {

using Clock = std::chrono::steady_clock;
constexpr int kMaxFollowerRetries = 3;

bool UpstreamUnreachable(const Status& s) {
  return s.code() == StatusCode::kUnavailable || s.code() == StatusCode::kDeadlineExceeded;
}

std::string ManifestKey(const std::string& name) { return "M" + name; }
std::string SampleIndexKey(const std::string& version, uint32_t shard) {
  return "X" + version + "/" + std::to_string(shard);
}

}  // namespace

CachedSource::CachedSource(const CacheOptions& options, std::unique_ptr<ChunkSource> upstream)
    : options_(options), upstream_(std::move(upstream)), dram_(options.memory_bytes) {}

CachedSource::~CachedSource() = default;

Result<std::unique_ptr<CachedSource>> CachedSource::Open(const CacheOptions& options,
                                                         std::unique_ptr<ChunkSource> upstream) {
  if (!upstream) return InvalidArgument("CachedSource needs an upstream");
  SC_RETURN_IF_ERROR(options.Validate());
  std::unique_ptr<CachedSource> src(new CachedSource(options, std::move(upstream)));
  if (options.size_bytes > 0) {
    SC_ASSIGN_OR_RETURN(src->store_, NvmeStore::Open(options, &src->plan_));
  }
  CacheMetrics::Get();  // every family of the cache exists from here on
  src->stats_source_ = metrics::Registry::Global().AddSource(src.get());
  // The NVMe budget in effect: cache.size fitted to the file system (cache_dir.h).
  const uint64_t nvme_bytes = src->store_ ? src->store_->Stats().size_bytes : 0;
  spdlog::info("cache: ready (nvme {} in {}, dram {}, eviction {})", FormatBytes(nvme_bytes),
               options.size_bytes ? options.dir : std::string("-"), FormatBytes(options.memory_bytes),
               EvictionPolicyName(options.eviction));
  return src;
}

Result<std::vector<v1::DatasetSummary>> CachedSource::ListDatasets() { return upstream_->ListDatasets(); }

void CachedSource::RememberVersion(const std::string& name, const std::string& version) {
  auto range = versions_seen_.equal_range(name);
  for (auto it = range.first; it != range.second; ++it) {
    if (it->second == version) return;
  }
  versions_seen_.emplace(name, version);
}

Result<DatasetPtr> CachedSource::OpenDataset(const std::string& name) {
  SC_RETURN_IF_ERROR(CheckDatasetName(name));
  auto fresh = upstream_->OpenDataset(name);
  if (fresh.ok()) {
    bool changed = true;
    {
      MutexLock lock(&mu_);
      auto it = datasets_.find(name);
      changed = it == datasets_.end() || it->second->version != (*fresh)->version;
      datasets_[name] = *fresh;
      RememberVersion(name, (*fresh)->version);
    }
    if (changed && store_) {
      Status s = store_->index_db().PutBlob(ManifestKey(name), (*fresh)->manifest_bytes);
      if (!s.ok()) SC_LOG_RATE_LIMITED(spdlog::level::warn, "cache: remembering manifest of '{}': {}", name, s.ToString());
      const uint64_t chunk_bytes = (*fresh)->manifest.chunk_bytes();
      if (ExtentBytes(chunk_bytes) > options_.segment_bytes) {
        spdlog::error("cache: dataset '{}' has {} chunks, which do not fit a {} segment (cache.segment_size): "
                      "they are served but never cached; set cache.segment_size to at least {}",
                      name, FormatBytes(chunk_bytes), FormatBytes(options_.segment_bytes),
                      FormatBytes(2 * ExtentBytes(chunk_bytes)));
      }
    }
    return fresh;
  }
  if (!UpstreamUnreachable(fresh.status())) return fresh.status();
  // Upstream unreachable: serve the manifest we last saw, so cached data stays usable.
  {
    MutexLock lock(&mu_);
    auto it = datasets_.find(name);
    if (it != datasets_.end()) return it->second;
  }
  if (store_) {
    auto bytes = store_->index_db().GetBlob(ManifestKey(name));
    if (bytes.ok()) {
      auto ds = dataset::MakeDataset(std::move(*bytes), "cached manifest of '" + name + "'", name);
      if (ds.ok()) {
        SC_LOG_RATE_LIMITED(spdlog::level::warn, "cache: upstream unreachable ({}); using the cached manifest of '{}'",
                            fresh.status().ToString(), name);
        MutexLock lock(&mu_);
        datasets_[name] = *ds;
        RememberVersion(name, (*ds)->version);
        return *ds;
      }
    }
  }
  return fresh.status();
}

Result<std::string> CachedSource::GetSampleIndex(const DatasetPtr& dataset, uint32_t shard) {
  if (store_) {
    auto cached = store_->index_db().GetBlob(SampleIndexKey(dataset->version, shard));
    if (cached.ok()) return cached;
  }
  auto fresh = upstream_->GetSampleIndex(dataset, shard);
  if (fresh.ok() && store_) {
    // Only after the upstream validated it against the manifest; the key includes the version.
    Status s = store_->index_db().PutBlob(SampleIndexKey(dataset->version, shard), *fresh);
    if (!s.ok()) SC_LOG_RATE_LIMITED(spdlog::level::warn, "cache: remembering a sample index: {}", s.ToString());
  }
  return fresh;
}

ChunkPtr CachedSource::FindCached(const ChunkKey& key, uint64_t length, const Hash128& hash, Tier* tier) {
  if (ChunkPtr c = dram_.Get(key)) {
    *tier = Tier::kDram;
    return c;
  }
  if (!store_) return nullptr;
  if (ChunkPtr c = store_->Pending(key)) {
    *tier = Tier::kDram;
    return c;
  }
  NvmeLookup req{key, length, hash};
  auto got = store_->Lookup(std::span<const NvmeLookup>(&req, 1));
  if (got[0]) {
    *tier = Tier::kNvme;
    dram_.Put(key, got[0]);
    return got[0];
  }
  return nullptr;
}

void CachedSource::Account(Tier tier, uint64_t bytes) {
  switch (tier) {
    case Tier::kDram:
      served_dram_.fetch_add(bytes, std::memory_order_relaxed);
      hits_dram_.fetch_add(1, std::memory_order_relaxed);
      break;
    case Tier::kNvme:
      served_nvme_.fetch_add(bytes, std::memory_order_relaxed);
      hits_nvme_.fetch_add(1, std::memory_order_relaxed);
      break;
    case Tier::kUpstream:
      served_upstream_.fetch_add(bytes, std::memory_order_relaxed);
      misses_.fetch_add(1, std::memory_order_relaxed);
      break;
    case Tier::kNone: break;
  }
}

// One chunk of a ReadChunks window: where it is, once found.
struct CachedSource::Slot {
  ChunkKey key;
  uint64_t length = 0;
  Hash128 hash;
  ChunkPtr chunk;
  Tier tier = Tier::kNone;
};

std::vector<CachedSource::Slot> CachedSource::LookUp(const DatasetPtr& dataset, uint32_t shard, uint64_t from,
                                                     uint64_t to) {
  const auto& manifest = dataset->manifest;
  const Hash128 vid = VersionId(dataset->version);
  std::vector<Slot> slots(to - from);
  std::vector<NvmeLookup> nvme_reqs;
  std::vector<size_t> nvme_slots;
  for (size_t i = 0; i < slots.size(); ++i) {
    Slot& s = slots[i];
    const uint64_t c = from + i;
    s.key = ChunkKey{vid, shard, c};
    s.length = dataset::ChunkLength(manifest, shard, c);
    s.hash = dataset::ChunkHash(manifest, shard, c);
    if ((s.chunk = dram_.Get(s.key))) {
      s.tier = Tier::kDram;
    } else if (store_ && (s.chunk = store_->Pending(s.key))) {
      s.tier = Tier::kDram;
    } else if (store_) {
      nvme_reqs.push_back(NvmeLookup{s.key, s.length, s.hash});
      nvme_slots.push_back(i);
    }
  }
  if (!nvme_reqs.empty()) {
    // One io_uring batch for every NVMe hit in the window.
    auto got = store_->Lookup(nvme_reqs);
    for (size_t k = 0; k < got.size(); ++k) {
      if (!got[k]) continue;
      Slot& s = slots[nvme_slots[k]];
      s.chunk = std::move(got[k]);
      s.tier = Tier::kNvme;
      dram_.Put(s.key, s.chunk);
    }
  }
  return slots;
}

size_t CachedSource::ExtendRun(std::vector<Slot>& slots, size_t i, std::vector<Flight>* run) {
  size_t j = i + 1;
  while (j < slots.size() && !slots[j].chunk) {
    auto t = flights_.Join(slots[j].key);
    if (!t.leader()) break;  // someone else fetches it; we will follow when we get there
    // Like the first chunk, this one may have landed since the lookup: then the run ends
    // here and the chunk is delivered from memory, not fetched a second time.
    if (ChunkPtr c = FindCached(slots[j].key, slots[j].length, slots[j].hash, &slots[j].tier)) {
      t.Publish(Result<ChunkPtr>(c));
      slots[j].chunk = std::move(c);
      break;
    }
    run->push_back(std::move(t));
    ++j;
  }
  return j;
}

Status CachedSource::FetchRun(const DatasetPtr& dataset, uint32_t shard, uint64_t run_first, Slot* run_slots,
                              std::vector<Flight>& run, const ReadOptions& options, const ChunkSink& sink) {
  const bool demand = options.priority == FetchPriority::kDemand;
  size_t delivered = 0;
  Status sink_status;
  upstream_calls_.fetch_add(1, std::memory_order_relaxed);
  Status up = upstream_->ReadChunks(
      dataset, shard, run_first, run.size(), options, [&](uint64_t c, const ChunkPtr& chunk) -> Status {
        const size_t k = static_cast<size_t>(c - run_first);
        if (c < run_first || k != delivered || k >= run.size() || !chunk) {
          return Internal("upstream delivered chunk " + std::to_string(c) + " out of order (expected " +
                          std::to_string(run_first + delivered) + ")");
        }
        Slot& slot = run_slots[k];
        // End-to-end: never trust what arrived, even from a verifying upstream.
        if (chunk->bytes.size() != slot.length || ChunkDigest(chunk->bytes.data(), chunk->bytes.size()) != slot.hash) {
          return DataLoss("upstream chunk " + slot.key.ToString() + " does not match its manifest hash");
        }
        dram_.Put(slot.key, chunk);
        if (store_) store_->Insert(slot.key, chunk, options.deadline);
        run[k].Publish(Result<ChunkPtr>(chunk));
        fetched_.fetch_add(1, std::memory_order_relaxed);
        ++delivered;
        Account(Tier::kUpstream, chunk->bytes.size());
        if (demand) plan_.OnDemandRead(slot.key);
        sink_status = sink(c, chunk);
        return sink_status;
      });
  if (!sink_status.ok()) return sink_status;
  if (!up.ok() || delivered != run.size()) {
    Status err = up.ok() ? Internal("upstream ended the range after " + std::to_string(delivered) + " of " +
                                    std::to_string(run.size()) + " chunks")
                         : up;
    for (size_t k = delivered; k < run.size(); ++k) run[k].Publish(Result<ChunkPtr>(err));
    return err;
  }
  return Status::Ok();
}

Status CachedSource::ReadChunks(const DatasetPtr& dataset, uint32_t shard, uint64_t first, uint64_t count,
                                const ReadOptions& options, const ChunkSink& sink) {
  SC_RETURN_IF_ERROR(CheckChunkRange(dataset, shard, first, count));
  const bool demand = options.priority == FetchPriority::kDemand;
  const uint64_t end = first + count;
  uint64_t next = first;
  int follower_retries = 0;
  while (next < end) {
    const uint64_t window_end = std::min<uint64_t>(end, next + options_.max_fetch_run_chunks);
    std::vector<Slot> slots = LookUp(dataset, shard, next, window_end);
    bool restart = false;
    for (size_t i = 0; i < slots.size() && !restart;) {
      Slot& s = slots[i];
      if (s.chunk) {
        Account(s.tier, s.chunk->bytes.size());
        if (demand) plan_.OnDemandRead(s.key);
        SC_RETURN_IF_ERROR(sink(next + i, s.chunk));
        ++i;
        continue;
      }
      auto ticket = flights_.Join(s.key);
      if (!ticket.leader()) {
        if (demand) upstream_->Expedite(s.key);  // the leader may be a prefetch
        auto waited = ticket.Wait(options.deadline);
        Result<ChunkPtr> r = waited ? std::move(*waited)
                                    : Result<ChunkPtr>(DeadlineExceeded(
                                          "timed out waiting for chunk " + s.key.ToString() +
                                          ", which another caller is fetching"));
        if (r.ok()) {
          joined_.fetch_add(1, std::memory_order_relaxed);
          s.chunk = *r;
          s.tier = Tier::kDram;  // received from a sibling's fetch: a memory hit for this caller
          continue;              // delivered by the branch above
        }
        if (Clock::now() >= options.deadline) {
          return r.status().code() == StatusCode::kDeadlineExceeded ? r.status()
                                                                     : DeadlineExceeded(r.status().message());
        }
        if (++follower_retries > kMaxFollowerRetries) return r.status();
        next += i;  // lead the fetch ourselves from here
        restart = true;
        break;
      }
      // Leader. The chunk may have landed between the lookup and Join.
      Tier tier = Tier::kNone;
      if (ChunkPtr c = FindCached(s.key, s.length, s.hash, &tier)) {
        ticket.Publish(Result<ChunkPtr>(c));
        s.chunk = c;
        s.tier = tier;
        continue;
      }
      // Extend the run over following misses we can lead too, and fetch it.
      std::vector<Flight> run;
      run.push_back(std::move(ticket));
      const size_t j = ExtendRun(slots, i, &run);
      SC_RETURN_IF_ERROR(FetchRun(dataset, shard, next + i, &slots[i], run, options, sink));
      i = j;
    }
    if (!restart) next = window_end;
  }
  return Status::Ok();
}

Status CachedSource::ReadPieces(const DatasetPtr& dataset, uint32_t shard,
                                std::span<const ChunkPiece> pieces, const ReadOptions& options) {
  if (options.keep_only && !options.whole_chunks) return KeepPieces(dataset, shard, pieces, options);
  const auto& manifest = dataset->manifest;
  const Hash128 vid = VersionId(dataset->version);
  const bool demand = options.priority == FetchPriority::kDemand;
  std::vector<NvmePiece> on_disk;
  std::vector<ChunkPiece> missing;
  for (const ChunkPiece& p : pieces) {
    SC_RETURN_IF_ERROR(CheckChunkRange(dataset, shard, p.chunk, 1));
    const uint64_t length = dataset::ChunkLength(manifest, shard, p.chunk);
    SC_RETURN_IF_ERROR(CheckPiece(dataset, shard, p, length));
    if (p.length == 0) continue;  // nothing to read, nothing to count
    const ChunkKey key{vid, shard, p.chunk};
    if (HeldPiece held = PieceInMemory(key, p); held.bytes) {
      CopyFromMemory(p, held, key, demand);
    } else if (store_) {
      on_disk.push_back(NvmePiece{key, length, dataset::ChunkHash(manifest, shard, p.chunk), p.offset,
                                  p.length, p.dest});
    } else {
      missing.push_back(p);
    }
  }
  if (!on_disk.empty()) {
    const std::vector<bool> hit = store_->ReadPieces(on_disk);
    std::vector<ChunkPiece> not_whole;
    for (size_t k = 0; k < on_disk.size(); ++k) {
      const NvmePiece& p = on_disk[k];
      if (!hit[k]) {
        not_whole.push_back(ChunkPiece{p.key.chunk, p.offset, p.length, p.dest});
        continue;
      }
      Account(Tier::kNvme, p.length);
      if (demand) plan_.OnDemandRead(p.key);
    }
    ReadRunsFromDisk(vid, shard, not_whole, demand, &missing);
  }
  if (missing.empty()) return Status::Ok();
  if (!options.whole_chunks) {
    // The caller's own piece_done hears of each by its index among `pieces` (found by its dest:
    // destinations do not overlap).
    std::vector<size_t> caller_index;
    if (options.piece_done) {
      std::unordered_map<const uint8_t*, size_t> index_of;
      for (size_t i = 0; i < pieces.size(); ++i) index_of.emplace(pieces[i].dest, i);
      for (const ChunkPiece& p : missing) caller_index.push_back(index_of.at(p.dest));
    }
    return FetchRuns(dataset, shard, missing, caller_index, options);
  }
  // Whole chunks through ReadChunks: single-flight with every other reader, stored on arrival.
  return ChunkSource::ReadPieces(dataset, shard, missing, options);
}

Status CachedSource::KeepPieces(const DatasetPtr& dataset, uint32_t shard, std::span<const ChunkPiece> pieces,
                                const ReadOptions& options) {
  const Hash128 vid = VersionId(dataset->version);
  std::vector<ChunkPiece> missing;
  std::vector<size_t> caller_index;
  for (size_t i = 0; i < pieces.size(); ++i) {
    const ChunkPiece& p = pieces[i];
    SC_RETURN_IF_ERROR(CheckChunkRange(dataset, shard, p.chunk, 1));
    SC_RETURN_IF_ERROR(CheckPiece(dataset, shard, p, dataset::ChunkLength(dataset->manifest, shard, p.chunk)));
    if (p.dest != nullptr) return InvalidArgument("a keep_only read of pieces takes no destinations");
    if (p.length == 0 || PieceHeld(ChunkKey{vid, shard, p.chunk}, p)) continue;
    missing.push_back(p);
    caller_index.push_back(i);
  }
  return FetchRuns(dataset, shard, missing, caller_index, options);
}

Status CachedSource::FetchRuns(const DatasetPtr& dataset, uint32_t shard, std::span<const ChunkPiece> missing,
                               std::span<const size_t> caller_index, const ReadOptions& options) {
  if (missing.empty()) return Status::Ok();
  // Only the blocks the pieces cover, verified by the upstream against the manifest, landing
  // straight in the runs (chunk_run.h) the tiers keep; each is kept as soon as it lands: a read
  // that asks for it meanwhile finds it here instead of fetching it again (the flight it came on
  // is over). A caller that wants the bytes gets a copy of its run.
  const Hash128 vid = VersionId(dataset->version);
  std::vector<RunId> ids;
  std::vector<std::shared_ptr<Chunk>> runs;
  std::vector<ChunkPiece> landing;
  for (const ChunkPiece& p : missing) {
    ids.push_back(RunId{ChunkKey{vid, shard, p.chunk}, p.offset, p.length});
    runs.push_back(NewRun(ids.back()));
    landing.push_back(ChunkPiece{p.chunk, p.offset, p.length, runs.back()->bytes.data()});
  }
  std::vector<bool> kept(missing.size(), false);
  const auto keep = [&](size_t i) {
    SealRun(ids[i], *runs[i]);
    if (missing[i].dest != nullptr) std::memcpy(missing[i].dest, runs[i]->bytes.data(), missing[i].length);
    KeepRun(RunKey(ids[i]), runs[i]);
    kept[i] = true;
  };
  ReadOptions o = options;
  o.keep_only = false;
  o.piece_done = [&](size_t i) {
    keep(i);
    if (options.piece_done) options.piece_done(caller_index[i]);
  };
  const Status st = upstream_->ReadPieces(dataset, shard, landing, o);
  for (size_t i = 0; i < missing.size(); ++i) {
    if (!kept[i] && st.ok()) keep(i);
    if (kept[i]) Account(Tier::kUpstream, missing[i].length);  // a miss each
  }
  return st;
}

void CachedSource::ReadRunsFromDisk(const Hash128& vid, uint32_t shard, std::span<const ChunkPiece> pieces,
                                    bool demand, std::vector<ChunkPiece>* missing) {
  if (pieces.empty()) return;
  std::vector<RunId> ids;
  ids.reserve(pieces.size());
  std::vector<NvmeLookup> lookups;
  for (const ChunkPiece& p : pieces) ids.push_back(RunId{ChunkKey{vid, shard, p.chunk}, p.offset, p.length});
  for (const RunId& id : ids) lookups.push_back(NvmeLookup{RunKey(id), RunStoredBytes(id), Hash128{}, &id});
  std::vector<ChunkPtr> runs = store_->Lookup(lookups);
  for (size_t k = 0; k < pieces.size(); ++k) {
    const ChunkPiece& p = pieces[k];
    if (!runs[k]) {
      missing->push_back(p);
      continue;
    }
    dram_.Put(lookups[k].key, runs[k]);
    std::memcpy(p.dest, runs[k]->bytes.data(), p.length);
    Account(Tier::kNvme, p.length);
    run_hits_.fetch_add(1, std::memory_order_relaxed);
    if (demand) plan_.OnDemandRead(ids[k].chunk);
  }
}

void CachedSource::KeepRun(const ChunkKey& key, ChunkPtr run) {
  dram_.Put(key, run);
  // Never waits for the write queue: a run the queue has no room for is only in DRAM.
  if (store_) store_->Insert(key, std::move(run), Clock::now());
  runs_kept_.fetch_add(1, std::memory_order_relaxed);
}

ChunkPtr CachedSource::InMemory(const ChunkKey& key) {
  ChunkPtr c = dram_.Get(key);
  if (!c && store_) c = store_->Pending(key);
  return c;
}

CachedSource::HeldPiece CachedSource::PieceInMemory(const ChunkKey& key, const ChunkPiece& piece) {
  if (ChunkPtr c = InMemory(key)) return HeldPiece{std::move(c), piece.offset, false};
  return HeldPiece{InMemory(RunKey(RunId{key, piece.offset, piece.length})), 0, true};
}

void CachedSource::CopyFromMemory(const ChunkPiece& piece, const HeldPiece& held, const ChunkKey& key, bool demand) {
  std::memcpy(piece.dest, held.bytes->bytes.data() + held.at, piece.length);
  Account(Tier::kDram, piece.length);
  if (held.run) run_hits_.fetch_add(1, std::memory_order_relaxed);
  if (demand) plan_.OnDemandRead(key);
}

bool CachedSource::Held(const ChunkKey& key) const {
  // Pending before Contains: the writer publishes the entry before it leaves the queue.
  return dram_.Contains(key) || (store_ && (store_->Pending(key) || store_->Contains(key)));
}

bool CachedSource::PieceHeld(const ChunkKey& key, const ChunkPiece& piece) const {
  return Held(key) || Held(RunKey(RunId{key, piece.offset, piece.length}));
}

bool CachedSource::ReadPiecesFromMemory(const DatasetPtr& dataset, uint32_t shard,
                                        std::span<const ChunkPiece> pieces, FetchPriority priority) {
  const auto& manifest = dataset->manifest;
  const Hash128 vid = VersionId(dataset->version);
  std::vector<HeldPiece> held(pieces.size());
  for (size_t i = 0; i < pieces.size(); ++i) {
    const ChunkPiece& p = pieces[i];
    if (!CheckChunkRange(dataset, shard, p.chunk, 1).ok() ||
        !CheckPiece(dataset, shard, p, dataset::ChunkLength(manifest, shard, p.chunk)).ok()) {
      return false;
    }
    if (p.length == 0) continue;
    held[i] = PieceInMemory(ChunkKey{vid, shard, p.chunk}, p);
    if (!held[i].bytes) return false;
  }
  for (size_t i = 0; i < pieces.size(); ++i) {
    if (pieces[i].length == 0) continue;
    CopyFromMemory(pieces[i], held[i], ChunkKey{vid, shard, pieces[i].chunk},
                   priority == FetchPriority::kDemand);
  }
  return true;
}

bool CachedSource::Holds(const DatasetPtr& dataset, uint32_t shard, uint64_t first, uint64_t count) {
  if (!CheckChunkRange(dataset, shard, first, count).ok()) return false;
  const Hash128 vid = VersionId(dataset->version);
  for (uint64_t c = first; c < first + count; ++c) {
    if (!Held(ChunkKey{vid, shard, c})) return false;
  }
  return true;
}

bool CachedSource::HoldsPieces(const DatasetPtr& dataset, uint32_t shard, std::span<const ChunkPiece> pieces) {
  const Hash128 vid = VersionId(dataset->version);
  for (const ChunkPiece& p : pieces) {
    if (!CheckChunkRange(dataset, shard, p.chunk, 1).ok()) return false;
    if (!PieceHeld(ChunkKey{vid, shard, p.chunk}, p)) return false;
  }
  return true;
}

uint64_t CachedSource::CapacityBytes() {
  const uint64_t nvme = store_ ? store_->Stats().size_bytes : 0;
  return std::max(nvme, dram_.budget_bytes());
}

Status CachedSource::Prefetch(const DatasetPtr& dataset, uint32_t shard, uint64_t first, uint64_t count,
                              const ReadOptions& options) {
  SC_RETURN_IF_ERROR(CheckChunkRange(dataset, shard, first, count));
  const Hash128 vid = VersionId(dataset->version);
  auto held = [&](uint64_t c) { return Held(ChunkKey{vid, shard, c}); };
  const uint64_t end = first + count;
  for (uint64_t c = first; c < end;) {
    while (c < end && held(c)) ++c;
    uint64_t run_end = c;
    while (run_end < end && !held(run_end)) ++run_end;
    if (run_end > c) {
      SC_RETURN_IF_ERROR(ReadChunks(dataset, shard, c, run_end - c, options,
                                    [](uint64_t, const ChunkPtr&) { return Status::Ok(); }));
    }
    c = run_end;
  }
  return Status::Ok();
}

Status CachedSource::SetSizeBytes(uint64_t size_bytes) {
  if (!store_) {
    if (size_bytes == 0) return Status::Ok();
    return FailedPrecondition("the NVMe tier was not opened (cache.size was 0); a restart is needed to enable it");
  }
  store_->SetSizeBytes(size_bytes);
  return Status::Ok();
}

void CachedSource::SetMemoryBytes(uint64_t memory_bytes) {
  dram_.SetBudget(memory_bytes);
}

Status CachedSource::Evict(const std::string& dataset) {
  SC_RETURN_IF_ERROR(CheckDatasetName(dataset));
  std::vector<std::string> versions;
  auto current = upstream_->OpenDataset(dataset);
  {
    MutexLock lock(&mu_);
    if (current.ok()) RememberVersion(dataset, (*current)->version);
    auto range = versions_seen_.equal_range(dataset);
    for (auto it = range.first; it != range.second; ++it) versions.push_back(it->second);
  }
  if (versions.empty()) {
    if (store_) {
      auto bytes = store_->index_db().GetBlob(ManifestKey(dataset));
      if (bytes.ok()) versions.push_back(dataset::ManifestVersion(*bytes));
    }
    if (versions.empty()) return NotFound("no cached version of dataset '" + dataset + "' is known");
  }
  for (const auto& v : versions) {
    const Hash128 vid = VersionId(v);
    dram_.EraseVersion(vid);
    if (store_) SC_RETURN_IF_ERROR(store_->EvictVersion(vid));
  }
  spdlog::info("cache: evicted {} version(s) of dataset '{}'", versions.size(), dataset);
  return Status::Ok();
}

void CachedSource::Flush() {
  if (store_) store_->Flush();
}

CacheStats CachedSource::Stats() const {
  CacheStats st;
  st.dram_used_bytes = dram_.used_bytes();
  st.dram_budget_bytes = dram_.budget_bytes();
  st.dram_entries = dram_.entries();
  st.nvme_enabled = store_ != nullptr;
  if (store_) st.nvme = store_->Stats();
  st.served_dram_bytes = served_dram_.load();
  st.served_nvme_bytes = served_nvme_.load();
  st.served_upstream_bytes = served_upstream_.load();
  st.hits_dram = hits_dram_.load();
  st.hits_nvme = hits_nvme_.load();
  st.misses = misses_.load();
  st.upstream_fetched_chunks = fetched_.load();
  st.upstream_calls = upstream_calls_.load();
  st.joined_flights = joined_.load();
  st.runs_kept = runs_kept_.load();
  st.run_hits = run_hits_.load();
  return st;
}

void CachedSource::VisitStats(const stats::Visitor& visit) const {
  static const stats::Labels kDram{{"tier", "dram"}}, kNvme{{"tier", "nvme"}}, kUpstream{{"tier", "upstream"}};
  stats::Counter(visit, kServedBytes, served_dram_.load(), &kDram);
  stats::Counter(visit, kServedBytes, served_nvme_.load(), &kNvme);
  stats::Counter(visit, kServedBytes, served_upstream_.load(), &kUpstream);
  stats::Counter(visit, kHits, hits_dram_.load(), &kDram);
  stats::Counter(visit, kHits, hits_nvme_.load(), &kNvme);
  stats::Counter(visit, kMisses, misses_.load());
  stats::Counter(visit, kUpstreamFetches, fetched_.load());
  stats::Counter(visit, kRunsKept, runs_kept_.load());
  stats::Counter(visit, kRunHits, run_hits_.load());
  stats::Gauge(visit, kDramUsed, static_cast<double>(dram_.used_bytes()));
  stats::Gauge(visit, kDramBudget, static_cast<double>(dram_.budget_bytes()));
}

std::string CacheStats::ToJson() const {
  // ordered_json: the keys in this order, as `shardctl warm` and the epoch traces print them.
  const nlohmann::ordered_json j = {
      {"dram_used_bytes", dram_used_bytes}, {"dram_budget_bytes", dram_budget_bytes},
      {"dram_entries", dram_entries}, {"nvme_enabled", nvme_enabled},
      {"nvme_budget_bytes", nvme.size_bytes}, {"nvme_segment_bytes", nvme.segment_bytes},
      {"nvme_segments", nvme.segments}, {"nvme_allocated_bytes", nvme.segment_allocated_bytes},
      {"nvme_index_bytes", nvme.index_bytes}, {"nvme_entries", nvme.entries},
      {"nvme_queued_bytes", nvme.queued_bytes}, {"nvme_written_bytes", nvme.written_bytes},
      {"evicted_segments", nvme.evicted_segments}, {"checksum_failures", nvme.checksum_failures},
      {"enospc_passthrough", nvme.enospc_passthrough}, {"admission_declined", nvme.admission_declined},
      {"eviction", nvme.policy}, {"io_uring", nvme.io_uring},
      {"served_dram_bytes", served_dram_bytes}, {"served_nvme_bytes", served_nvme_bytes},
      {"served_upstream_bytes", served_upstream_bytes}, {"hits_dram", hits_dram},
      {"hits_nvme", hits_nvme}, {"misses", misses},
      {"upstream_fetched_chunks", upstream_fetched_chunks}, {"upstream_calls", upstream_calls},
      {"joined_flights", joined_flights}, {"runs_kept", runs_kept}, {"run_hits", run_hits}};
  return j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

}  // namespace shardcache::cache
