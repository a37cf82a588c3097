#include "daemon/cache/nvme_store.h"

#include <algorithm>
#include <cstring>
#include <set>

#include <spdlog/spdlog.h>

#include "common/log.h"
#include "common/metrics.h"
#include "daemon/cache/cache_dir.h"
#include "daemon/cache/cache_metrics.h"
#include "daemon/cache/io_reader.h"

namespace shardcache::cache {
namespace {

using Clock = std::chrono::steady_clock;

}  // namespace

NvmeStore::NvmeStore(const CacheOptions& options, uint64_t configured_size_bytes, std::unique_ptr<IndexDb> db,
                     std::unique_ptr<DiskHealth> health, const AccessPlan* plan)
    : options_(options),
      db_(std::move(db)),
      policy_(MakeEvictionPolicy(options.eviction, plan)),
      health_(std::move(health)),
      segments_(options_, configured_size_bytes, policy_.get(), &index_),
      writer_(options_, db_.get(), health_.get(), &mu_, &index_, &segments_) {}

Result<std::unique_ptr<NvmeStore>> NvmeStore::OpenIndexAndRecover(const CacheOptions& options,
                                                                 uint64_t configured_size_bytes,
                                                                 const AccessPlan* plan) {
  SC_ASSIGN_OR_RETURN(auto health, DiskHealth::Open(options.dir));
  SC_ASSIGN_OR_RETURN(auto db, IndexDb::Open(options.dir + "/index", options.index_block_cache_bytes));
  std::unique_ptr<NvmeStore> store(
      new NvmeStore(options, configured_size_bytes, std::move(db), std::move(health), plan));
  {
    MutexLock lock(&store->mu_);  // not shared yet: for the analysis
    SC_RETURN_IF_ERROR(Recover(options.dir, *store->db_, &store->index_, &store->segments_, &store->recovery_));
  }
  return store;
}

Result<std::unique_ptr<NvmeStore>> NvmeStore::Open(const CacheOptions& requested, const AccessPlan* plan) {
  SC_RETURN_IF_ERROR(requested.Validate());
  if (requested.size_bytes == 0) return InvalidArgument("NvmeStore needs cache.size > 0");
  if (requested.eviction == EvictionPolicyKind::kClairvoyant && plan == nullptr) {
    return InvalidArgument("clairvoyant eviction needs an access plan");
  }
  SC_RETURN_IF_ERROR(PrepareCacheDir(requested));
  // A budget the file system cannot hold would be reported as if it could: use what it holds.
  CacheOptions options = requested;
  options.size_bytes = FitToFileSystem(requested, requested.size_bytes);
  if (options.size_bytes != requested.size_bytes) {
    SC_RETURN_IF_ERROR(options.Validate().WithContext("cache.size fitted to the file system of " + options.dir));
  }
  auto opened = OpenIndexAndRecover(options, requested.size_bytes, plan);
  if (!opened.ok() && IndexUnusable(opened.status())) {
    SC_RETURN_IF_ERROR(SetIndexAside(options.dir, opened.status()));
    opened = OpenIndexAndRecover(options, requested.size_bytes, plan);  // empty: the segment files are orphans and go
  }
  SC_ASSIGN_OR_RETURN(auto store, std::move(opened));
  store->io_uring_ = IoReader::UsingIoUring(options.use_io_uring);
  store->writer_.Start();
  store->writer_.EnforceLimits();
  CacheMetrics::Get();  // every family of the cache exists from here on
  store->stats_source_ = metrics::Registry::Global().AddSource(store.get());
  return store;
}

NvmeStore::~NvmeStore() {
  stats_source_.Reset();  // its last counts stay in the Registry's series
  writer_.Stop();
}

// ---------------------------------------------------------------------------------------------
// Reads

std::optional<std::pair<Loc, std::shared_ptr<SegmentFile>>> NvmeStore::TouchLocked(uint64_t fp) {
  const std::optional<Loc> loc = index_.Find(fp);
  if (!loc) return std::nullopt;
  std::shared_ptr<SegmentFile> file = segments_.MarkRead(loc->segment);
  if (!file) return std::nullopt;
  return std::make_pair(*loc, std::move(file));
}

std::vector<ChunkPtr> NvmeStore::Lookup(std::span<const NvmeLookup> requests) {
  const auto& m = CacheMetrics::Get();
  std::vector<ChunkPtr> out(requests.size());
  struct Job {
    size_t index;
    uint64_t fp;
    Loc loc;
    std::shared_ptr<SegmentFile> file;
    AlignedBuffer buf;
  };
  std::vector<Job> jobs;
  {
    MutexLock lock(&mu_);
    for (size_t i = 0; i < requests.size(); ++i) {
      const uint64_t fp = Fingerprint(requests[i].key);
      auto found = TouchLocked(fp);
      if (!found) continue;
      jobs.push_back(Job{i, fp, found->first, std::move(found->second), AlignedBuffer()});
    }
  }
  if (jobs.empty()) {
    misses_.fetch_add(requests.size(), std::memory_order_relaxed);
    return out;
  }
  std::vector<ReadRequest> reads;
  reads.reserve(jobs.size());
  for (auto& j : jobs) {
    j.buf = AlignedBuffer(AlignUp(j.loc.length, kDirectIoAlign));
    reads.push_back(ReadRequest{j.file->fd(), j.loc.offset, j.buf.data(), j.buf.size(), &j.file->path(), Status()});
  }
  const auto t0 = Clock::now();
  Status batch = IoReader::ReadBatch(reads, options_.use_io_uring);
  m.nvme_read_seconds->Observe(std::chrono::duration<double>(Clock::now() - t0).count());
  size_t hits = 0;
  for (size_t k = 0; k < jobs.size(); ++k) {
    Job& j = jobs[k];
    const NvmeLookup& want = requests[j.index];
    if (!batch.ok() || !reads[k].status.ok()) {
      health_->ReportIoError((batch.ok() ? reads[k].status : batch).WithContext("reading chunk " + want.key.ToString()));
      DropEntry(j.fp, j.loc);
      continue;
    }
    j.buf.Resize(j.loc.length);
    const Hash128 got = want.run ? Hash128{} : ChunkDigest(j.buf.data(), j.buf.size());
    const bool intact = want.run ? RunIntact(*want.run, j.buf.data(), j.buf.size())
                                 : j.loc.length == want.length && got == want.hash;
    if (!intact) {
      checksum_failures_.fetch_add(1, std::memory_order_relaxed);
      SC_LOG_RATE_LIMITED(spdlog::level::err,
                          "cache: {} {} at {} offset {} failed verification (length {} want {}{}); "
                          "dropped, will refetch",
                          want.run ? "run" : "chunk", want.key.ToString(), j.file->path(), j.loc.offset,
                          j.loc.length, want.length,
                          want.run ? ", trailer" : ", hash " + got.ToHex() + " want " + want.hash.ToHex());
      DropEntry(j.fp, j.loc);
      continue;
    }
    auto chunk = std::make_shared<Chunk>();
    chunk->bytes = std::move(j.buf);
    chunk->hash = got;
    out[j.index] = std::move(chunk);
    ++hits;
  }
  hits_.fetch_add(hits, std::memory_order_relaxed);
  misses_.fetch_add(requests.size() - hits, std::memory_order_relaxed);
  return out;
}

// One piece ReadPieces found in the index: its read plan and buffers.
struct NvmeStore::PieceJob {
  size_t index;  // in the caller's pieces
  uint64_t fp;
  Loc loc;
  std::shared_ptr<SegmentFile> file;
  PieceRead plan;
  uint8_t* bounce = nullptr;  // the data when !plan.direct (in the call's scratch)
  uint8_t* table = nullptr;   // table pages of the blocks read (partial reads; in the scratch)
};

std::vector<NvmeStore::PieceJob> NvmeStore::FindPieces(std::span<const NvmePiece> pieces, std::vector<bool>* hit) {
  std::vector<PieceJob> jobs;
  MutexLock lock(&mu_);
  for (size_t i = 0; i < pieces.size(); ++i) {
    const NvmePiece& p = pieces[i];
    if (p.length == 0) {
      (*hit)[i] = true;
      continue;
    }
    if (p.offset > p.chunk_length || p.length > p.chunk_length - p.offset) continue;  // caller's bug
    const uint64_t fp = Fingerprint(pieces[i].key);
    auto found = TouchLocked(fp);
    if (!found) continue;
    PieceJob j;
    j.index = i;
    j.fp = fp;
    j.loc = found->first;
    j.file = std::move(found->second);
    jobs.push_back(std::move(j));
  }
  return jobs;
}

std::vector<bool> NvmeStore::ReadPieces(std::span<const NvmePiece> pieces) {
  const auto& m = CacheMetrics::Get();
  std::vector<bool> hit(pieces.size(), false);
  std::vector<PieceJob> jobs = FindPieces(pieces, &hit);
  uint64_t scratch_bytes = 0;
  for (PieceJob& j : jobs) {
    const NvmePiece& p = pieces[j.index];
    j.plan = PlanPieceRead(p.offset, p.length, p.chunk_length, j.loc.length, p.dest);
    scratch_bytes += (j.plan.direct ? 0 : j.plan.data_len) + j.plan.table_len;  // 4 KiB multiples
  }
  ScratchPool::Lease lease = scratch_.Borrow(scratch_bytes);
  uint8_t* scratch = lease.data();
  std::vector<ReadRequest> reads;
  reads.reserve(2 * jobs.size());
  for (PieceJob& j : jobs) {
    const NvmePiece& p = pieces[j.index];
    uint8_t* target = p.dest;
    if (!j.plan.direct) {
      j.bounce = target = scratch;
      scratch += j.plan.data_len;
    }
    reads.push_back(ReadRequest{j.file->fd(), j.loc.offset + j.plan.data_off, target, j.plan.data_len,
                                &j.file->path(), Status()});
    if (!j.plan.whole) {
      j.table = scratch;
      scratch += j.plan.table_len;
      reads.push_back(ReadRequest{j.file->fd(), j.loc.offset + AlignUp(j.loc.length, kDirectIoAlign) + j.plan.table_off,
                                  j.table, j.plan.table_len, &j.file->path(), Status()});
    }
  }
  size_t hits = 0;
  if (!reads.empty()) {
    const auto t0 = Clock::now();
    Status batch = IoReader::ReadBatch(reads, options_.use_io_uring);
    m.nvme_read_seconds->Observe(std::chrono::duration<double>(Clock::now() - t0).count());
    size_t r = 0;
    for (PieceJob& j : jobs) {
      const NvmePiece& p = pieces[j.index];
      Status io = batch.ok() ? reads[r++].status : batch;
      if (!j.plan.whole) {
        const Status& t = reads[r++].status;
        if (io.ok() && !t.ok()) io = t;
      }
      if (!io.ok()) {
        health_->ReportIoError(io.WithContext("reading chunk " + p.key.ToString()));
        DropEntry(j.fp, j.loc);
        continue;
      }
      const uint8_t* data = j.plan.direct ? p.dest : j.bounce;
      const std::string bad = VerifyPiece(j.plan, data, j.table, j.loc.length, p.chunk_length, p.chunk_hash);
      if (!bad.empty()) {
        // Several pieces of one corrupt chunk in one call: the chunk is counted and logged once.
        if (DropEntry(j.fp, j.loc)) {
          checksum_failures_.fetch_add(1, std::memory_order_relaxed);
          SC_LOG_RATE_LIMITED(spdlog::level::err,
                              "cache: chunk {} at {} offset {} failed verification ({}); dropped, will refetch",
                              p.key.ToString(), j.file->path(), j.loc.offset, bad);
        }
        continue;
      }
      if (!j.plan.direct) std::memcpy(p.dest, data + (p.offset - j.plan.data_off), p.length);
      hit[j.index] = true;
      ++hits;
    }
  }
  size_t empty = 0;
  for (const auto& p : pieces) empty += p.length == 0;
  hits_.fetch_add(hits, std::memory_order_relaxed);
  misses_.fetch_add(pieces.size() - empty - hits, std::memory_order_relaxed);
  return hit;
}

bool NvmeStore::Contains(const ChunkKey& key) const {
  MutexLock lock(&mu_);
  return index_.Contains(Fingerprint(key));
}

ChunkPtr NvmeStore::Pending(const ChunkKey& key) const { return writer_.Pending(key); }

bool NvmeStore::DropEntry(uint64_t fp, const Loc& loc) {
  {
    MutexLock lock(&mu_);
    if (!index_.Drop(fp, loc)) return false;  // already gone or replaced
  }
  Status s = db_->DropEntries({EntryLocation{loc.segment, loc.offset}});
  if (!s.ok()) health_->ReportIoError(s);
  return true;
}

// ---------------------------------------------------------------------------------------------
// Writes (nvme_writer.h)

bool NvmeStore::Insert(const ChunkKey& key, ChunkPtr chunk, Clock::time_point deadline) {
  return writer_.Insert(key, std::move(chunk), deadline);
}

void NvmeStore::Flush() { writer_.Flush(); }

void NvmeStore::SetSizeBytes(uint64_t size_bytes) {
  const uint64_t fitted = FitToFileSystem(options_, size_bytes);
  {
    MutexLock lock(&mu_);
    segments_.SetSize(fitted, size_bytes);
  }
  writer_.EnforceLimits();
}

Status NvmeStore::EvictVersion(const Hash128& version) {
  Flush();
  std::vector<EntryLocation> drop;
  std::vector<std::pair<uint64_t, Loc>> fps;
  SC_RETURN_IF_ERROR(db_->ForEachEntry(
      [&](const EntryLocation& loc, const EntryRecord& e) {
        if (e.version_high != version.high || e.version_low != version.low) return;
        drop.push_back(loc);
        fps.emplace_back(Fingerprint(ChunkKey{version, e.shard, e.chunk}), Loc{loc.segment, e.length, loc.offset});
      },
      [](const EntryLocation&) {}));
  std::vector<std::shared_ptr<SegmentFile>> victims;
  {
    MutexLock lock(&mu_);
    std::set<uint32_t> touched;
    for (const auto& [fp, loc] : fps) {
      if (index_.Drop(fp, loc)) touched.insert(loc.segment);
    }
    victims = segments_.EvictEmpty(touched);
  }
  SC_RETURN_IF_ERROR(db_->DropEntries(drop));
  writer_.DropFiles(victims);
  return Status::Ok();
}

// ---------------------------------------------------------------------------------------------
// Statistics

void NvmeStore::VisitStats(const stats::Visitor& visit) const {
  uint64_t size_bytes, segments, index_bytes, evicted;
  {
    MutexLock lock(&mu_);
    size_bytes = segments_.size_bytes();
    segments = segments_.count();
    index_bytes = segments_.measured_index_bytes();
    evicted = segments_.evicted();
  }
  const WriterCounts w = writer_.counts();
  stats::Counter(visit, kEvictedSegments, evicted);
  stats::Counter(visit, kEvictedBytes, evicted * options_.segment_bytes);
  stats::Counter(visit, kChecksumFailures, checksum_failures_.load());
  stats::Counter(visit, kEnospcPassthrough, w.enospc_passthrough);
  stats::Counter(visit, kAdmissionDeclined, w.admission_declined);
  stats::Counter(visit, kWrittenBytes, w.written_bytes);
  const uint64_t used_bytes = segments * options_.segment_bytes + index_bytes;
  stats::Gauge(visit, kNvmeUsed, static_cast<double>(used_bytes));
  stats::Gauge(visit, kNvmeBudget, static_cast<double>(size_bytes));
  stats::Gauge(visit, kIndexMemory, static_cast<double>(db_->MemoryBytes()));
}

NvmeStats NvmeStore::Stats() const {
  NvmeStats st;
  {
    MutexLock lock(&mu_);
    st.size_bytes = segments_.size_bytes();
    st.configured_size_bytes = segments_.configured_size_bytes();
    st.segments = segments_.count();
    st.entries = index_.size();
    st.index_bytes = segments_.measured_index_bytes();
    st.index_allowance_bytes = segments_.IndexAllowance(st.index_bytes);
    st.evicted_segments = segments_.evicted();
  }
  st.queued_bytes = writer_.queued_bytes();
  st.segment_bytes = options_.segment_bytes;
  st.segment_allocated_bytes = st.segments * options_.segment_bytes;
  st.index_memory_bytes = db_->MemoryBytes();
  const WriterCounts w = writer_.counts();
  st.written_bytes = w.written_bytes;
  st.hits = hits_.load();
  st.misses = misses_.load();
  st.checksum_failures = checksum_failures_.load();
  st.enospc_passthrough = w.enospc_passthrough;
  st.admission_declined = w.admission_declined;
  st.queue_full_dropped = w.queue_full_dropped;
  st.io_uring = io_uring_;
  st.policy = policy_->name();
  st.disk_problem = disk_problem();
  return st;
}

}  // namespace shardcache::cache
