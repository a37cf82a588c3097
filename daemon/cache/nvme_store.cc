#include "daemon/cache/nvme_store.h"

#include <dirent.h>
#include <limits.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <set>

#include <spdlog/spdlog.h>

#include "common/log.h"
#include "common/metrics.h"
#include "common/units.h"
#include "daemon/cache/cache_dir.h"
#include "daemon/cache/cache_metrics.h"
#include "daemon/cache/io_reader.h"

namespace shardcache::cache {
namespace {

using Clock = std::chrono::steady_clock;
// The cache directory and the index directory themselves (du counts their blocks).
constexpr uint64_t kDirOverheadBytes = 8192;
// Head-room for WAL and memtable flushes between two measurements of the index directory
// (capped at half the reserve, since the index is re-measured at every segment roll).
constexpr uint64_t kIndexGrowthBytes = 8ull << 20;
// The writer takes up to this much from the queue at once (one pwritev per segment run).
constexpr size_t kMaxBatchItems = 256;
constexpr uint64_t kMaxBatchBytes = 16ull << 20;

uint64_t NowUnixSeconds() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::seconds>(
                                   std::chrono::system_clock::now().time_since_epoch())
                                   .count());
}

}  // namespace

NvmeStore::NvmeStore(const CacheOptions& options, uint64_t configured_size_bytes, std::unique_ptr<IndexDb> db,
                     std::unique_ptr<DiskHealth> health, const AccessPlan* plan)
    : options_(options),
      db_(std::move(db)),
      policy_(MakeEvictionPolicy(options.eviction, plan)),
      health_(std::move(health)),
      size_bytes_(options.size_bytes),
      configured_size_bytes_(configured_size_bytes) {}

namespace {

// An index that cannot be read as it is (corrupt files, another format, an I/O error) is set
// aside and the cache starts empty: it is only a cache, and refusing to start would make a
// restart loop of one bad disk sector. Refusals that a fresh index would meet as well
// (permissions, a full disk, a LOCK held) stay errors.
bool IndexUnusable(const Status& s) {
  switch (s.code()) {
    case StatusCode::kDataLoss:
    case StatusCode::kFailedPrecondition:
    case StatusCode::kInternal:
    case StatusCode::kInvalidArgument:
      return true;
    default:
      return false;
  }
}

metrics::Counter* IndexResets() {
  static auto* c = metrics::Registry::Global().GetCounter(
      "shardcache_cache_index_resets_total", "Cache indexes set aside as unreadable at start (the cache started empty)");
  return c;
}

// Set-aside indexes kept for diagnosis; older ones are removed.
constexpr size_t kKeptUnreadableIndexes = 2;

// Renames dir/index to dir/index.unreadable-<UTC time> and keeps the newest few of those.
Status SetIndexAside(const std::string& dir, const Status& why) {
  char stamp[32];
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  std::strftime(stamp, sizeof stamp, "%Y%m%dT%H%M%SZ", &tm);
  const std::string from = dir + "/index", to = dir + "/index.unreadable-" + stamp;
  if (::rename(from.c_str(), to.c_str()) != 0) return ErrnoStatus(errno, "setting aside cache index " + from);
  IndexResets()->Add();
  spdlog::error("cache: the index {} cannot be used ({}); moved it to {} and starting with an empty cache",
                from, why.ToString(), to);
  std::vector<std::string> aside;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    if (e.path().filename().string().rfind("index.unreadable-", 0) == 0) aside.push_back(e.path());
  }
  std::sort(aside.begin(), aside.end());  // by time: the names sort as their stamps
  for (size_t i = 0; i + kKeptUnreadableIndexes < aside.size(); ++i) {
    std::error_code ec;
    std::filesystem::remove_all(aside[i], ec);
  }
  return Status::Ok();
}

}  // namespace

Result<std::unique_ptr<NvmeStore>> NvmeStore::OpenIndexAndRecover(const CacheOptions& options,
                                                                 uint64_t configured_size_bytes,
                                                                 const AccessPlan* plan) {
  SC_ASSIGN_OR_RETURN(auto health, DiskHealth::Open(options.dir));
  SC_ASSIGN_OR_RETURN(auto db, IndexDb::Open(options.dir + "/index", options.index_block_cache_bytes));
  std::unique_ptr<NvmeStore> store(
      new NvmeStore(options, configured_size_bytes, std::move(db), std::move(health), plan));
  {
    MutexLock lock(&store->mu_);
    SC_RETURN_IF_ERROR(store->Recover());
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
  store->writer_ = std::thread([s = store.get()] { s->WriterLoop(); });
  store->EnforceLimits();
  CacheMetrics::Get();  // every family of the cache exists from here on
  store->stats_source_ = metrics::Registry::Global().AddSource(store.get());
  return store;
}

NvmeStore::~NvmeStore() {
  stats_source_.Reset();  // its last counts stay in the Registry's series
  {
    MutexLock lock(&mu_);
    stop_ = true;
  }
  writer_cv_.NotifyAll();
  space_cv_.NotifyAll();
  if (writer_.joinable()) writer_.join();
}

// ---------------------------------------------------------------------------------------------
// Recovery

Status NvmeStore::Recover() {
  const auto t0 = Clock::now();
  std::map<uint32_t, SegmentRecord> records;
  SC_RETURN_IF_ERROR(db_->ForEachSegment([&](uint32_t id, const SegmentRecord& r) { records[id] = r; }));
  // Segment files on disk: a readdir, not a scan of their contents.
  std::set<uint32_t> files;
  if (DIR* d = opendir(options_.dir.c_str())) {
    while (dirent* e = readdir(d)) {
      uint32_t id;
      if (SegmentFile::ParseName(e->d_name, &id)) files.insert(id);
    }
    closedir(d);
  } else {
    return ErrnoStatus(errno, "listing cache directory " + options_.dir);
  }
  uint32_t max_id = files.empty() ? 0 : *files.rbegin();
  if (!records.empty()) max_id = std::max(max_id, records.rbegin()->first);
  for (uint32_t id : files) {
    if (records.count(id) == 0) {
      // Created but never committed (crash before the first group commit): nothing points in.
      ::unlink(SegmentFile::PathFor(options_.dir, id).c_str());
      ++recovery_.orphan_files;
    }
  }
  SC_RETURN_IF_ERROR(OpenRecordedSegments(records, files));
  SC_RETURN_IF_ERROR(LoadEntries());
  recovery_.segments = segments_.size();
  next_segment_id_ = max_id + 1;
  measured_index_bytes_ = db_->DiskBytes();
  recovery_.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  spdlog::info("cache: recovered {} chunks in {} segments from {} in {:.3f} s ({} entries and {} segments dropped, {} orphan files removed)",
               recovery_.entries, recovery_.segments, options_.dir, recovery_.seconds,
               recovery_.dropped_entries, recovery_.dropped_segments, recovery_.orphan_files);
  return Status::Ok();
}

Status NvmeStore::OpenRecordedSegments(const std::map<uint32_t, SegmentRecord>& records,
                                       const std::set<uint32_t>& files) {
  std::map<uint32_t, std::shared_ptr<SegmentFile>> opened;
  for (const auto& [id, rec] : records) {
    std::string problem;
    if (files.count(id) == 0) {
      problem = SegmentFile::PathFor(options_.dir, id) + " is missing";
    } else if (auto file = SegmentFile::OpenExisting(options_.dir, id); !file.ok()) {
      problem = file.status().ToString();
    } else if ((*file)->size_bytes() < rec.durable_bytes) {
      problem = (*file)->path() + " is " + std::to_string((*file)->size_bytes()) +
                " bytes, shorter than its durable watermark " + std::to_string(rec.durable_bytes);
    } else {
      opened[id] = std::move(*file);
      continue;
    }
    spdlog::warn("cache: dropping segment {} and its entries: {}", id, problem);
    SC_RETURN_IF_ERROR(db_->DropSegment(id));
    ::unlink(SegmentFile::PathFor(options_.dir, id).c_str());
    ++recovery_.dropped_segments;
  }
  // Order segments by their persisted last access for LRU ticks.
  std::vector<std::pair<uint64_t, uint32_t>> order;
  for (const auto& [id, file] : opened) order.emplace_back(records.at(id).last_access_s, id);
  std::sort(order.begin(), order.end());
  for (const auto& [when, id] : order) {
    const SegmentRecord& rec = records.at(id);
    Segment seg;
    seg.file = opened[id];
    seg.write_offset = rec.durable_bytes;
    seg.durable_bytes = rec.durable_bytes;
    seg.sealed = true;
    seg.last_tick = ++tick_;
    seg.record_dirty = (rec.flags & kSegmentSealed) == 0;
    segments_.emplace(id, std::move(seg));
  }
  return Status::Ok();
}

Status NvmeStore::LoadEntries() {
  std::vector<EntryLocation> drop;
  const auto t_entries = Clock::now();
  uint64_t duplicates = 0;
  index_.reserve(db_->EstimateKeys());
  // Entries arrive in (segment, offset) order: remember the current segment.
  auto cur = segments_.end();
  Status s = db_->ForEachEntry(
      [&](const EntryLocation& loc, const EntryRecord& e) REQUIRES(mu_) {
        if (cur == segments_.end() || cur->first != loc.segment) cur = segments_.find(loc.segment);
        auto it = cur;
        const uint64_t extent = ExtentBytes(e.length);
        if (it == segments_.end() || loc.offset % kDirectIoAlign != 0 || e.length == 0 ||
            loc.offset + extent > it->second.durable_bytes) {
          drop.push_back(loc);
          return;
        }
        const ChunkKey key{Hash128{e.version_high, e.version_low}, e.shard, e.chunk};
        const uint64_t fp = Fingerprint(key);
        auto [pos, inserted] = index_.try_emplace(fp, Loc{loc.segment, e.length, loc.offset});
        if (!inserted) {
          // The same chunk stored twice (refetched after a drop): the later copy wins.
          ++duplicates;
          RemoveFingerprintLocked(fp, pos->second.segment);
          pos->second = Loc{loc.segment, e.length, loc.offset};
        }
        it->second.fingerprints.push_back(fp);
        ++recovery_.entries;
      },
      [&](const EntryLocation& loc) { drop.push_back(loc); });
  SC_RETURN_IF_ERROR(s);
  spdlog::info("cache: index entries read in {:.3f} s ({} duplicates)",
               std::chrono::duration<double>(Clock::now() - t_entries).count(), duplicates);
  if (!drop.empty()) {
    spdlog::warn("cache: dropping {} index entries that point past a durable watermark or into a missing segment",
                 drop.size());
    SC_RETURN_IF_ERROR(db_->DropEntries(drop));
  }
  recovery_.dropped_entries = drop.size();
  return Status::Ok();
}

// ---------------------------------------------------------------------------------------------
// Reads

std::optional<std::pair<NvmeStore::Loc, std::shared_ptr<SegmentFile>>> NvmeStore::TouchLocked(uint64_t fp) {
  auto it = index_.find(fp);
  if (it == index_.end()) return std::nullopt;
  auto seg = segments_.find(it->second.segment);
  if (seg == segments_.end()) return std::nullopt;
  seg->second.last_tick = ++tick_;
  seg->second.record_dirty = true;
  return std::make_pair(it->second, seg->second.file);
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
    const Hash128 got = HashBytes(j.buf.data(), j.buf.size());
    if (j.loc.length != want.length || got != want.hash) {
      checksum_failures_.fetch_add(1, std::memory_order_relaxed);
      SC_LOG_RATE_LIMITED(spdlog::level::err,
                          "cache: chunk {} at {} offset {} failed verification (length {} want {}, "
                          "hash {} want {}); dropped, will refetch",
                          want.key.ToString(), j.file->path(), j.loc.offset, j.loc.length, want.length,
                          got.ToHex(), want.hash.ToHex());
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
  return index_.count(Fingerprint(key)) > 0;
}

ChunkPtr NvmeStore::Pending(const ChunkKey& key) const {
  MutexLock lock(&mu_);
  auto it = pending_.find(key);
  return it == pending_.end() ? nullptr : it->second;
}

bool NvmeStore::DropEntry(uint64_t fp, const Loc& loc) {
  {
    MutexLock lock(&mu_);
    auto it = index_.find(fp);
    if (it == index_.end() || !(it->second == loc)) return false;  // already gone or replaced
    index_.erase(it);
    RemoveFingerprintLocked(fp, loc.segment);
  }
  Status s = db_->DropEntries({EntryLocation{loc.segment, loc.offset}});
  if (!s.ok()) health_->ReportIoError(s);
  return true;
}

void NvmeStore::RemoveFingerprintLocked(uint64_t fp, uint32_t segment) {
  auto seg = segments_.find(segment);
  if (seg == segments_.end()) return;
  auto& v = seg->second.fingerprints;
  auto it = std::find(v.begin(), v.end(), fp);
  if (it != v.end()) {
    *it = v.back();
    v.pop_back();
  }
}

// ---------------------------------------------------------------------------------------------
// Writes

bool NvmeStore::Insert(const ChunkKey& key, ChunkPtr chunk, Clock::time_point deadline) {
  if (!chunk) return false;
  if (!health_->healthy()) {
    CacheMetrics::Get().unstored_disk_failing->Add();
    return false;
  }
  const uint64_t bytes = chunk->bytes.size();
  MutexLock lock(&mu_);
  if (stop_ || index_.count(Fingerprint(key)) || pending_.count(key)) return false;
  while (queue_bytes_ + bytes > options_.write_queue_bytes && !queue_.empty() && !stop_) {
    if (space_cv_.WaitUntil(&mu_, deadline) == std::cv_status::timeout) {
      queue_full_dropped_.fetch_add(1, std::memory_order_relaxed);
      return false;
    }
  }
  if (stop_ || index_.count(Fingerprint(key)) || pending_.count(key)) return false;
  pending_.emplace(key, chunk);
  queue_.push_back(QueueItem{key, std::move(chunk)});
  queue_bytes_ += bytes;
  lock.Unlock();
  writer_cv_.NotifyOne();
  return true;
}

void NvmeStore::Flush() {
  MutexLock lock(&mu_);
  writer_cv_.NotifyOne();
  idle_cv_.Wait(&mu_, [&]() REQUIRES(mu_) {
    return stop_ || (queue_.empty() && !writer_busy_ && uncommitted_.empty());
  });
}

void NvmeStore::ProbeDisk() {
  health_->Probe(HeadroomAboveFloor(options_) >= static_cast<int64_t>(options_.segment_bytes));
}

void NvmeStore::WriterLoop() {
  auto last_commit = Clock::now();
  auto last_limits = Clock::now();
  auto last_probe = Clock::now();
  const auto interval = std::chrono::milliseconds(options_.commit_interval_ms);
  const auto idle_tick = std::chrono::milliseconds(options_.writer_idle_tick_ms);
  const auto probe_interval = std::chrono::milliseconds(options_.disk_probe_interval_ms);
  const auto persist_interval = std::chrono::milliseconds(options_.access_persist_interval_ms);
  MutexLock lock(&mu_);
  while (true) {
    if (queue_.empty()) {
      const bool have_work = !uncommitted_.empty();
      if (have_work || stop_) {
        writer_busy_ = true;
        lock.Unlock();
        Commit();
        last_commit = Clock::now();
        lock.Lock();
        writer_busy_ = false;
      }
      idle_cv_.NotifyAll();
      if (stop_ && queue_.empty()) break;
      if (queue_.empty()) {
        writer_cv_.WaitFor(&mu_, idle_tick);
        if (queue_.empty() && Clock::now() - last_limits > idle_tick) {
          // Idle: persist access times now and then, and give space back if the floor is hit.
          bool dirty = false;
          for (auto& [id, s] : segments_) dirty |= s.record_dirty;
          writer_busy_ = true;
          lock.Unlock();
          if (dirty && Clock::now() - last_commit > persist_interval) {
            Commit();
            last_commit = Clock::now();
          }
          EnforceLimits();
          ProbeDisk();
          last_limits = last_probe = Clock::now();
          lock.Lock();
          writer_busy_ = false;
          idle_cv_.NotifyAll();
        }
      }
      continue;
    }
    std::vector<QueueItem> batch;
    uint64_t batch_bytes = 0;
    while (!queue_.empty() && batch.size() < kMaxBatchItems && batch_bytes < kMaxBatchBytes) {
      batch_bytes += queue_.front().chunk->bytes.size();
      batch.push_back(std::move(queue_.front()));
      queue_.pop_front();
    }
    writer_busy_ = true;
    lock.Unlock();
    StoreBatch(batch);
    if (Clock::now() - last_probe >= probe_interval) {  // busy: the idle tick above never runs
      ProbeDisk();
      last_probe = Clock::now();
    }
    lock.Lock();
    for (const auto& item : batch) {
      auto p = pending_.find(item.key);
      if (p != pending_.end() && p->second == item.chunk) pending_.erase(p);
    }
    queue_bytes_ -= batch_bytes;
    space_cv_.NotifyAll();
    const bool commit_due = uncommitted_bytes_ >= options_.commit_bytes ||
                            (!uncommitted_.empty() && Clock::now() - last_commit >= interval);
    if (commit_due) {
      lock.Unlock();
      Commit();
      last_commit = Clock::now();
      lock.Lock();
    }
    writer_busy_ = false;
  }
}

uint64_t NvmeStore::IndexAllowance(uint64_t measured) const {
  const uint64_t reserve = options_.EffectiveIndexReserve();
  return std::max(reserve, measured + std::min(kIndexGrowthBytes, reserve / 2));
}

std::optional<uint32_t> NvmeStore::PickVictimLocked(std::optional<uint64_t> incoming) {
  std::vector<SegmentSummary> sealed;
  sealed.reserve(segments_.size());
  for (const auto& [id, s] : segments_) {
    if (id == open_segment_) continue;
    sealed.push_back(SegmentSummary{id, s.last_tick, &s.fingerprints});
  }
  if (sealed.empty()) return std::nullopt;
  return policy_->PickVictim(sealed, incoming);
}

std::shared_ptr<SegmentFile> NvmeStore::EvictLocked(uint32_t id) {
  auto it = segments_.find(id);
  if (it == segments_.end()) return nullptr;
  for (uint64_t fp : it->second.fingerprints) {
    auto e = index_.find(fp);
    if (e != index_.end() && e->second.segment == id) index_.erase(e);
  }
  auto file = std::move(it->second.file);
  segments_.erase(it);
  if (open_segment_ == id) open_segment_ = 0;
  evicted_segments_.fetch_add(1, std::memory_order_relaxed);
  return file;
}

void NvmeStore::DropFiles(const std::vector<std::shared_ptr<SegmentFile>>& files) {
  for (const auto& f : files) {
    if (!f) continue;
    // Index first (synced), then the file: a crash in between leaves an orphan file, which
    // start-up deletes, never an entry without its data.
    Status s = db_->DropSegment(f->id());
    if (!s.ok()) health_->ReportIoError(s);
    s = f->Unlink();
    if (!s.ok()) health_->ReportIoError(s);
  }
}

uint64_t NvmeStore::AllocatedBytes(size_t segments, uint64_t measured_index_bytes) const {
  return segments * options_.segment_bytes + IndexAllowance(measured_index_bytes) + kDirOverheadBytes;
}

NvmeStore::Room NvmeStore::MakeRoomLocked(uint64_t measured, int64_t headroom, uint64_t fp,
                                          std::vector<std::shared_ptr<SegmentFile>>* victims) {
  int64_t freed = 0;
  while (true) {
    const bool over_budget = AllocatedBytes(segments_.size() + 1, measured) > size_bytes_;
    const bool over_floor = headroom + freed < static_cast<int64_t>(options_.segment_bytes);
    if (!over_budget && !over_floor) return Room::kMade;
    // Over the budget the policy may decline the chunk; short of disk space it must give a
    // segment back (forced), and with none left the chunk passes through.
    std::optional<uint32_t> victim = PickVictimLocked(over_budget ? std::optional<uint64_t>(fp) : std::nullopt);
    if (!victim) return over_budget ? Room::kDeclined : Room::kDiskFull;
    victims->push_back(EvictLocked(*victim));
    freed += static_cast<int64_t>(options_.segment_bytes);
  }
}

Result<std::shared_ptr<SegmentFile>> NvmeStore::CreateSegment(uint32_t id) {
  auto file = SegmentFile::Create(options_.dir, id, options_.segment_bytes);
  if (!file.ok() && file.status().code() == StatusCode::kResourceExhausted) {
    // Disk full from outside: give one segment back and try once more.
    std::shared_ptr<SegmentFile> victim;
    {
      MutexLock lock(&mu_);
      if (auto v = PickVictimLocked(std::nullopt)) victim = EvictLocked(*v);
    }
    if (victim) {
      DropFiles({victim});
      file = SegmentFile::Create(options_.dir, id, options_.segment_bytes);
    }
  }
  return file;
}

void NvmeStore::PassThroughNoSpace(const std::string& what) {
  enospc_passthrough_.fetch_add(1, std::memory_order_relaxed);
  health_->ReportNoSpace(what);
}

bool NvmeStore::EnsureOpenSegment(uint64_t extent, uint64_t fp) {
  const uint64_t measured = db_->DiskBytes();
  const int64_t headroom = HeadroomAboveFloor(options_);
  std::vector<std::shared_ptr<SegmentFile>> victims;
  uint32_t id = 0;
  Room room;
  {
    MutexLock lock(&mu_);
    measured_index_bytes_ = measured;
    if (open_segment_ != 0) {
      auto& s = segments_[open_segment_];
      if (s.write_offset + extent <= options_.segment_bytes) return true;
      s.sealed = true;
      s.record_dirty = true;
      open_segment_ = 0;
    }
    if (Clock::now() < enospc_backoff_until_) {
      enospc_passthrough_.fetch_add(1, std::memory_order_relaxed);
      return false;
    }
    room = MakeRoomLocked(measured, headroom, fp, &victims);
    if (room == Room::kMade) id = next_segment_id_++;
  }
  DropFiles(victims);
  if (room == Room::kDiskFull) {
    PassThroughNoSpace("a new " + FormatBytes(options_.segment_bytes) + " segment");
    enospc_backoff_until_ = Clock::now() + std::chrono::milliseconds(options_.nospace_backoff_ms);
    return false;
  }
  if (room == Room::kDeclined) {
    admission_declined_.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  auto file = CreateSegment(id);
  if (!file.ok()) {
    if (file.status().code() == StatusCode::kResourceExhausted) {
      PassThroughNoSpace(file.status().message());
    } else {
      health_->ReportIoError(file.status());
    }
    enospc_backoff_until_ = Clock::now() + std::chrono::milliseconds(options_.nospace_backoff_ms);
    return false;
  }
  health_->ReportSpace();
  MutexLock lock(&mu_);
  Segment seg;
  seg.file = std::move(*file);
  seg.last_tick = ++tick_;
  seg.record_dirty = true;
  segments_.emplace(id, std::move(seg));
  open_segment_ = id;
  return true;
}

// Chunks planned back to back in one segment file from items[0].offset.
struct NvmeStore::Planned {
  const QueueItem* item;
  uint64_t fp;
  uint64_t length;
  uint64_t extent;
  uint64_t offset;
  AlignedBuffer table;  // block table, written right after the padded chunk bytes
};
struct NvmeStore::Group {
  std::vector<Planned> items;
  std::shared_ptr<SegmentFile> file;
  uint32_t segment = 0;
};

Status NvmeStore::WriteExtents(const Group& g) {
  // One pwritev per IOV_MAX iovecs, cut at chunk boundaries (a chunk is its data, then its
  // block table when it has one).
  Status w = Status::Ok();
  std::vector<struct iovec> iov;
  iov.reserve(2 * g.items.size());
  size_t first_in_write = 0;
  for (size_t k = 0; k <= g.items.size() && w.ok(); ++k) {
    const size_t need = k < g.items.size() ? (g.items[k].table.size() ? 2 : 1) : 0;
    if (k == g.items.size() || iov.size() + need > IOV_MAX) {
      w = g.file->WriteV(iov.data(), static_cast<int>(iov.size()), g.items[first_in_write].offset);
      iov.clear();
      first_in_write = k;
      if (k == g.items.size()) break;
    }
    const auto& p = g.items[k];
    // AlignedBuffer capacity is rounded up to 4 KiB, so the padded chunk is readable; the
    // pad bytes are never served (reads stop at the chunk length).
    iov.push_back({const_cast<uint8_t*>(p.item->chunk->bytes.data()), AlignUp(p.length, kDirectIoAlign)});
    if (p.table.size()) iov.push_back({const_cast<uint8_t*>(p.table.data()), p.table.size()});
  }
  return w;
}

void NvmeStore::WriteGroup(Group& g) {
  if (g.items.empty()) return;
  const Status w = WriteExtents(g);
  MutexLock lock(&mu_);
  auto it = segments_.find(g.segment);
  if (!w.ok()) {
    if (it != segments_.end()) {
      it->second.sealed = true;  // never write behind a failed extent
      it->second.write_offset = g.items[0].offset;
      if (open_segment_ == g.segment) open_segment_ = 0;
    }
    if (w.code() == StatusCode::kResourceExhausted) {
      enospc_passthrough_.fetch_add(g.items.size(), std::memory_order_relaxed);
      health_->ReportNoSpace("writing " + std::to_string(g.items.size()) + " chunks to " + g.file->path());
    } else {
      health_->ReportIoError(w.WithContext("storing " + std::to_string(g.items.size()) + " chunks"));
    }
    g.items.clear();
    return;
  }
  uint64_t bytes = 0;
  for (const auto& p : g.items) bytes += p.extent;
  written_bytes_.fetch_add(bytes, std::memory_order_relaxed);
  if (it == segments_.end()) {  // evicted meanwhile (budget shrunk to nothing)
    g.items.clear();
    return;
  }
  for (const auto& p : g.items) {
    const QueueItem& item = *p.item;
    EntryRecord rec;
    rec.length = static_cast<uint32_t>(p.length);
    rec.version_high = item.key.version.high;
    rec.version_low = item.key.version.low;
    rec.shard = item.key.shard;
    rec.chunk = item.key.chunk;
    rec.hash_high = item.chunk->hash.high;
    rec.hash_low = item.chunk->hash.low;
    const Loc loc{g.segment, static_cast<uint32_t>(p.length), p.offset};
    auto [pos, inserted] = index_.try_emplace(p.fp, loc);
    if (!inserted) {
      RemoveFingerprintLocked(p.fp, pos->second.segment);
      pos->second = loc;
    }
    it->second.fingerprints.push_back(p.fp);
    uncommitted_.push_back(EntryPut{g.segment, p.offset, rec});
    uncommitted_bytes_ += p.extent;
  }
  it->second.last_tick = ++tick_;
  g.items.clear();
}

void NvmeStore::StoreBatch(std::vector<QueueItem>& items) {
  Group g;
  for (const QueueItem& item : items) {
    const uint64_t length = item.chunk->bytes.size();
    const uint64_t extent = ExtentBytes(length);
    const uint64_t fp = Fingerprint(item.key);
    if (!health_->healthy()) {
      CacheMetrics::Get().unstored_disk_failing->Add();
      continue;
    }
    if (extent > options_.segment_bytes) {
      // CachedSource names the dataset once (OpenDataset); every such chunk is counted.
      CacheMetrics::Get().unstored_larger_than_segment->Add();
      continue;
    }
    if (length == 0 || length > UINT32_MAX) continue;
    AlignedBuffer table = BlockTable(item.chunk->bytes.data(), length);  // outside mu_
    bool fits = false;
    {
      MutexLock lock(&mu_);
      if (index_.count(fp)) continue;
      if (open_segment_ != 0 && open_segment_ == g.segment) {
        fits = segments_[open_segment_].write_offset + extent <= options_.segment_bytes;
      }
    }
    if (!fits) {
      // Write what we have before the open segment may be sealed and victims chosen.
      WriteGroup(g);
      if (!EnsureOpenSegment(extent, fp)) continue;
    }
    MutexLock lock(&mu_);
    if (open_segment_ == 0) continue;
    const bool at_budget = AllocatedBytes(segments_.size() + 1, measured_index_bytes_) > size_bytes_;
    if (at_budget && !policy_->AdmitIntoFreedSpace(fp)) {
      admission_declined_.fetch_add(1, std::memory_order_relaxed);
      continue;
    }
    auto& s = segments_[open_segment_];
    if (open_segment_ != g.segment) {
      g.segment = open_segment_;
      g.file = s.file;
    }
    g.items.push_back(Planned{&item, fp, length, extent, s.write_offset, std::move(table)});
    s.write_offset += extent;
  }
  WriteGroup(g);
}

void NvmeStore::Commit() {
  std::vector<EntryPut> entries;
  std::vector<std::pair<uint32_t, SegmentRecord>> records;
  std::vector<std::shared_ptr<SegmentFile>> to_sync;
  const uint64_t now_s = NowUnixSeconds();
  {
    MutexLock lock(&mu_);
    entries.swap(uncommitted_);
    uncommitted_bytes_ = 0;
    std::set<uint32_t> with_data;
    for (const auto& e : entries) with_data.insert(e.segment);
    // Entries of segments evicted before their commit are dropped here.
    entries.erase(
        std::remove_if(entries.begin(), entries.end(),
                       [&](const EntryPut& e) REQUIRES(mu_) { return segments_.count(e.segment) == 0; }),
        entries.end());
    for (auto& [id, s] : segments_) {
      if (!s.record_dirty && with_data.count(id) == 0) continue;
      if (with_data.count(id)) to_sync.push_back(s.file);
      SegmentRecord r;
      r.durable_bytes = s.write_offset;
      r.last_access_s = now_s;
      r.flags = s.sealed ? kSegmentSealed : 0;
      records.emplace_back(id, r);
      s.record_dirty = false;
    }
  }
  if (entries.empty() && records.empty()) {
    idle_cv_.NotifyAll();
    return;
  }
  for (const auto& f : to_sync) {
    Status s = f->Sync();
    if (!s.ok()) {
      health_->ReportIoError(s.WithContext("syncing before the commit of " + std::to_string(entries.size()) +
                                           " entries (served from memory this run, never durable)"));
      return;
    }
  }
  Status s = db_->Commit(entries, records, /*sync=*/true);
  if (!s.ok()) {
    health_->ReportIoError(s.WithContext("group commit of " + std::to_string(entries.size()) + " entries"));
    return;
  }
  MutexLock lock(&mu_);
  for (const auto& [id, r] : records) {
    auto it = segments_.find(id);
    if (it != segments_.end()) it->second.durable_bytes = std::max(it->second.durable_bytes, r.durable_bytes);
  }
}

void NvmeStore::EnforceLimits() {
  // Forced evictions while over the budget (after a shrink) or under the free-space floor.
  while (true) {
    const uint64_t measured = db_->DiskBytes();
    const int64_t headroom = HeadroomAboveFloor(options_);
    std::shared_ptr<SegmentFile> victim;
    {
      MutexLock lock(&mu_);
      measured_index_bytes_ = measured;
      if (AllocatedBytes(segments_.size(), measured) <= size_bytes_ && headroom >= 0) break;
      auto v = PickVictimLocked(std::nullopt);
      if (!v) {
        // Only the open segment is left: seal and drop it too when over.
        if (open_segment_ == 0) break;
        v = open_segment_;
      }
      victim = EvictLocked(*v);
    }
    DropFiles({victim});
  }
}

void NvmeStore::SetSizeBytes(uint64_t size_bytes) {
  const uint64_t fitted = FitToFileSystem(options_, size_bytes);
  {
    MutexLock lock(&mu_);
    size_bytes_ = fitted;
    configured_size_bytes_ = size_bytes;
  }
  EnforceLimits();
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
      auto it = index_.find(fp);
      if (it != index_.end() && it->second == loc) {
        index_.erase(it);
        RemoveFingerprintLocked(fp, loc.segment);
        touched.insert(loc.segment);
      }
    }
    for (uint32_t id : touched) {
      auto it = segments_.find(id);
      if (it != segments_.end() && it->second.fingerprints.empty() && id != open_segment_) {
        victims.push_back(EvictLocked(id));
      }
    }
  }
  SC_RETURN_IF_ERROR(db_->DropEntries(drop));
  DropFiles(victims);
  return Status::Ok();
}

void NvmeStore::VisitStats(const stats::Visitor& visit) const {
  uint64_t size_bytes, segments, index_bytes;
  {
    MutexLock lock(&mu_);
    size_bytes = size_bytes_;
    segments = segments_.size();
    index_bytes = measured_index_bytes_;
  }
  const uint64_t evicted = evicted_segments_.load();
  stats::Counter(visit, kEvictedSegments, evicted);
  stats::Counter(visit, kEvictedBytes, evicted * options_.segment_bytes);
  stats::Counter(visit, kChecksumFailures, checksum_failures_.load());
  stats::Counter(visit, kEnospcPassthrough, enospc_passthrough_.load());
  stats::Counter(visit, kAdmissionDeclined, admission_declined_.load());
  stats::Counter(visit, kWrittenBytes, written_bytes_.load());
  const uint64_t used_bytes = segments * options_.segment_bytes + index_bytes;
  stats::Gauge(visit, kNvmeUsed, static_cast<double>(used_bytes));
  stats::Gauge(visit, kNvmeBudget, static_cast<double>(size_bytes));
  stats::Gauge(visit, kIndexMemory, static_cast<double>(db_->MemoryBytes()));
}

NvmeStats NvmeStore::Stats() const {
  NvmeStats st;
  {
    MutexLock lock(&mu_);
    st.size_bytes = size_bytes_;
    st.configured_size_bytes = configured_size_bytes_;
    st.segments = segments_.size();
    st.entries = index_.size();
    st.queued_bytes = queue_bytes_;
    st.index_bytes = measured_index_bytes_;
  }
  st.segment_bytes = options_.segment_bytes;
  st.segment_allocated_bytes = st.segments * options_.segment_bytes;
  st.index_memory_bytes = db_->MemoryBytes();
  st.index_allowance_bytes = IndexAllowance(st.index_bytes);
  st.written_bytes = written_bytes_.load();
  st.hits = hits_.load();
  st.misses = misses_.load();
  st.evicted_segments = evicted_segments_.load();
  st.checksum_failures = checksum_failures_.load();
  st.enospc_passthrough = enospc_passthrough_.load();
  st.admission_declined = admission_declined_.load();
  st.queue_full_dropped = queue_full_dropped_.load();
  st.io_uring = io_uring_;
  st.policy = policy_->name();
  st.disk_problem = disk_problem();
  return st;
}

}  // namespace shardcache::cache
