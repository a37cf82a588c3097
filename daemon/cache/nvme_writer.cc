#include "daemon/cache/nvme_writer.h"

#include <limits.h>
#include <sys/uio.h>

#include <algorithm>
#include <set>

#include "common/thread_name.h"
#include "common/units.h"
#include "daemon/cache/cache_dir.h"
#include "daemon/cache/cache_metrics.h"
#include "daemon/cache/extent.h"

namespace shardcache::cache {
namespace {

using Clock = std::chrono::steady_clock;
// The writer takes up to this much from the queue at once (one pwritev per segment run).
constexpr size_t kMaxBatchItems = 256;
// A queue that runs empty within this long of the last commit waits for more before committing.
constexpr std::chrono::milliseconds kCommitSettle{50};
constexpr uint64_t kMaxBatchBytes = 16ull << 20;

uint64_t NowUnixSeconds() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::seconds>(
                                   std::chrono::system_clock::now().time_since_epoch())
                                   .count());
}

}  // namespace

NvmeWriter::NvmeWriter(const CacheOptions& options, IndexDb* db, DiskHealth* health, Mutex* mu, ChunkIndex* index,
                       SegmentManager* segments)
    : options_(options), db_(db), health_(health), mu_(*mu), index_(index), segments_(segments) {}

NvmeWriter::~NvmeWriter() { Stop(); }

void NvmeWriter::Start() {
  thread_ = std::thread([this] {
    NameThisThread("sc-nvme-write");
    WriterLoop();
  });
}

void NvmeWriter::Stop() {
  {
    MutexLock lock(&mu_);
    stop_ = true;
  }
  writer_cv_.NotifyAll();
  space_cv_.NotifyAll();
  if (thread_.joinable()) thread_.join();
}

// ---------------------------------------------------------------------------------------------
// The queue

bool NvmeWriter::Insert(const ChunkKey& key, ChunkPtr chunk, Clock::time_point deadline) {
  if (!chunk) return false;
  if (!health_->healthy()) {
    CacheMetrics::Get().unstored_disk_failing->Add();
    return false;
  }
  const uint64_t bytes = chunk->bytes.size();
  MutexLock lock(&mu_);
  if (stop_ || index_->Contains(Fingerprint(key)) || pending_.count(key)) return false;
  while (queue_bytes_ + bytes > options_.write_queue_bytes && !queue_.empty() && !stop_) {
    if (space_cv_.WaitUntil(&mu_, deadline) == std::cv_status::timeout) {
      queue_full_dropped_.fetch_add(1, std::memory_order_relaxed);
      return false;
    }
  }
  if (stop_ || index_->Contains(Fingerprint(key)) || pending_.count(key)) return false;
  pending_.emplace(key, chunk);
  queue_.push_back(QueueItem{key, std::move(chunk)});
  queue_bytes_ += bytes;
  lock.Unlock();
  writer_cv_.NotifyOne();
  return true;
}

ChunkPtr NvmeWriter::Pending(const ChunkKey& key) const {
  MutexLock lock(&mu_);
  auto it = pending_.find(key);
  return it == pending_.end() ? nullptr : it->second;
}

void NvmeWriter::Flush() {
  MutexLock lock(&mu_);
  ++flush_waiters_;
  writer_cv_.NotifyOne();
  idle_cv_.Wait(&mu_, [&]() REQUIRES(mu_) {
    return stop_ || (queue_.empty() && !writer_busy_ && uncommitted_.empty());
  });
  --flush_waiters_;
}

uint64_t NvmeWriter::queued_bytes() const {
  MutexLock lock(&mu_);
  return queue_bytes_;
}

WriterCounts NvmeWriter::counts() const {
  WriterCounts c;
  c.written_bytes = written_bytes_.load();
  c.enospc_passthrough = enospc_passthrough_.load();
  c.admission_declined = admission_declined_.load();
  c.queue_full_dropped = queue_full_dropped_.load();
  return c;
}

// ---------------------------------------------------------------------------------------------
// The writer thread

void NvmeWriter::ProbeDisk() {
  health_->Probe(HeadroomAboveFloor(options_) >= static_cast<int64_t>(options_.segment_bytes));
}

void NvmeWriter::WriterLoop() {
  Times last{Clock::now(), Clock::now(), Clock::now()};
  const auto interval = std::chrono::milliseconds(options_.commit_interval_ms);
  const auto probe_interval = std::chrono::milliseconds(options_.disk_probe_interval_ms);
  MutexLock lock(&mu_);
  while (true) {
    if (queue_.empty()) {
      if (!Idle(&last)) break;
      continue;
    }
    uint64_t batch_bytes = 0;
    std::vector<QueueItem> batch = TakeBatch(&batch_bytes);
    writer_busy_ = true;
    lock.Unlock();
    StoreBatch(batch);
    if (Clock::now() - last.probe >= probe_interval) {  // busy: the idle tick never runs
      ProbeDisk();
      last.probe = Clock::now();
    }
    lock.Lock();
    for (const auto& item : batch) {
      auto p = pending_.find(item.key);
      if (p != pending_.end() && p->second == item.chunk) pending_.erase(p);
    }
    queue_bytes_ -= batch_bytes;
    space_cv_.NotifyAll();
    const bool commit_due = uncommitted_bytes_ >= options_.commit_bytes ||
                            (!uncommitted_.empty() && Clock::now() - last.commit >= interval);
    if (commit_due) {
      lock.Unlock();
      Commit();
      last.commit = Clock::now();
      lock.Lock();
    }
    writer_busy_ = false;
  }
}

bool NvmeWriter::Idle(Times* last) {
  const auto idle_tick = std::chrono::milliseconds(options_.writer_idle_tick_ms);
  const auto persist_interval = std::chrono::milliseconds(options_.access_persist_interval_ms);
  // The queue ran empty: commit what is written, unless a commit went out moments ago. A trickle
  // of small entries (a global shuffle's sample runs, 64 KiB each) would otherwise sync the
  // segment and the index for every few of them.
  const auto settle = std::min(kCommitSettle, std::chrono::milliseconds(options_.commit_interval_ms));
  const auto since_commit = Clock::now() - last->commit;
  if (stop_ || (!uncommitted_.empty() && (since_commit >= settle || flush_waiters_ > 0))) {
    writer_busy_ = true;
    mu_.Unlock();
    Commit();
    last->commit = Clock::now();
    mu_.Lock();
    writer_busy_ = false;
  }
  idle_cv_.NotifyAll();
  if (stop_ && queue_.empty()) return false;
  if (!queue_.empty()) return true;
  const auto until_commit = std::chrono::duration_cast<std::chrono::milliseconds>(settle - since_commit);
  writer_cv_.WaitFor(&mu_, uncommitted_.empty() ? idle_tick
                                                : std::clamp(until_commit, std::chrono::milliseconds(1), idle_tick));
  if (queue_.empty() && Clock::now() - last->limits > idle_tick) {
    // Idle: persist access times now and then, and give space back if the floor is hit.
    const bool dirty = segments_->AnyRecordDirty();
    writer_busy_ = true;
    mu_.Unlock();
    if (dirty && Clock::now() - last->commit > persist_interval) {
      Commit();
      last->commit = Clock::now();
    }
    EnforceLimits();
    ProbeDisk();
    last->limits = last->probe = Clock::now();
    mu_.Lock();
    writer_busy_ = false;
    idle_cv_.NotifyAll();
  }
  return true;
}

std::vector<NvmeWriter::QueueItem> NvmeWriter::TakeBatch(uint64_t* bytes) {
  std::vector<QueueItem> batch;
  while (!queue_.empty() && batch.size() < kMaxBatchItems && *bytes < kMaxBatchBytes) {
    *bytes += queue_.front().chunk->bytes.size();
    batch.push_back(std::move(queue_.front()));
    queue_.pop_front();
  }
  return batch;
}

// ---------------------------------------------------------------------------------------------
// Segments

void NvmeWriter::DropFiles(const std::vector<std::shared_ptr<SegmentFile>>& files) {
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

Result<std::shared_ptr<SegmentFile>> NvmeWriter::CreateSegment(uint32_t id) {
  auto file = SegmentFile::Create(options_.dir, id, options_.segment_bytes);
  if (!file.ok() && file.status().code() == StatusCode::kResourceExhausted) {
    // Disk full from outside: give one segment back and try once more.
    std::shared_ptr<SegmentFile> victim;
    {
      MutexLock lock(&mu_);
      if (auto v = segments_->PickVictim(std::nullopt)) victim = segments_->Evict(*v);
    }
    if (victim) {
      DropFiles({victim});
      file = SegmentFile::Create(options_.dir, id, options_.segment_bytes);
    }
  }
  return file;
}

void NvmeWriter::PassThroughNoSpace(const std::string& what) {
  enospc_passthrough_.fetch_add(1, std::memory_order_relaxed);
  health_->ReportNoSpace(what);
}

bool NvmeWriter::EnsureOpenSegment(uint64_t extent, uint64_t fp) {
  const uint64_t measured = db_->DiskBytes();
  const int64_t headroom = HeadroomAboveFloor(options_);
  std::vector<std::shared_ptr<SegmentFile>> victims;
  uint32_t id = 0;
  SegmentManager::Room room;
  {
    MutexLock lock(&mu_);
    segments_->set_measured_index_bytes(measured);
    if (segments_->OpenHasRoom(extent)) return true;
    segments_->SealOpen();
    if (Clock::now() < enospc_backoff_until_) {
      enospc_passthrough_.fetch_add(1, std::memory_order_relaxed);
      return false;
    }
    room = segments_->MakeRoom(measured, headroom, fp, &victims);
    if (room == SegmentManager::Room::kMade) id = segments_->NextId();
  }
  DropFiles(victims);
  if (room == SegmentManager::Room::kDiskFull) {
    PassThroughNoSpace("a new " + FormatBytes(options_.segment_bytes) + " segment");
    enospc_backoff_until_ = Clock::now() + std::chrono::milliseconds(options_.nospace_backoff_ms);
    return false;
  }
  if (room == SegmentManager::Room::kDeclined) {
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
  segments_->AddOpen(id, std::move(*file));
  return true;
}

void NvmeWriter::EnforceLimits() {
  while (true) {
    const uint64_t measured = db_->DiskBytes();
    const int64_t headroom = HeadroomAboveFloor(options_);
    std::shared_ptr<SegmentFile> victim;
    {
      MutexLock lock(&mu_);
      segments_->set_measured_index_bytes(measured);
      if (!segments_->OverLimits(headroom)) break;
      auto v = segments_->PickForcedVictim();
      if (!v) break;
      victim = segments_->Evict(*v);
    }
    DropFiles({victim});
  }
}

// ---------------------------------------------------------------------------------------------
// Writing and committing

// A chunk planned into a group: its extent at `offset` of the group's segment.
struct NvmeWriter::Planned {
  const QueueItem* item;
  uint64_t fp;
  uint64_t length;
  uint64_t extent;
  uint64_t offset;
  AlignedBuffer table;  // block table, written right after the padded chunk bytes
};
// Chunks planned back to back in one segment file from items[0].offset.
struct NvmeWriter::Group {
  std::vector<Planned> items;
  std::shared_ptr<SegmentFile> file;
  uint32_t segment = 0;
};

Status NvmeWriter::WriteExtents(const Group& g) {
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

void NvmeWriter::WriteGroup(Group& g) {
  if (g.items.empty()) return;
  const Status w = WriteExtents(g);
  MutexLock lock(&mu_);
  if (!w.ok()) {
    segments_->SealAfterFailedWrite(g.segment, g.items[0].offset);
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
  if (!segments_->Contains(g.segment)) {  // evicted meanwhile (budget shrunk to nothing)
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
    index_->Put(p.fp, Loc{g.segment, static_cast<uint32_t>(p.length), p.offset});
    uncommitted_.push_back(EntryPut{g.segment, p.offset, rec});
    uncommitted_bytes_ += p.extent;
  }
  segments_->MarkWritten(g.segment);
  g.items.clear();
}

void NvmeWriter::StoreBatch(std::vector<QueueItem>& items) {
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
    AlignedBuffer table = BlockTable(item.chunk->bytes.data(), length);  // outside the mutex
    bool fits = false;
    {
      MutexLock lock(&mu_);
      if (index_->Contains(fp)) continue;
      fits = segments_->open_id() != 0 && segments_->open_id() == g.segment && segments_->OpenHasRoom(extent);
    }
    if (!fits) {
      // Write what we have before the open segment may be sealed and victims chosen.
      WriteGroup(g);
      if (!EnsureOpenSegment(extent, fp)) continue;
    }
    MutexLock lock(&mu_);
    if (segments_->open_id() == 0) continue;
    if (segments_->DeclinesIntoFreedSpace(fp)) {
      admission_declined_.fetch_add(1, std::memory_order_relaxed);
      continue;
    }
    SegmentManager::Slot slot = segments_->Reserve(extent);
    if (slot.segment != g.segment) {
      g.segment = slot.segment;
      g.file = std::move(slot.file);
    }
    g.items.push_back(Planned{&item, fp, length, extent, slot.offset, std::move(table)});
  }
  WriteGroup(g);
}

void NvmeWriter::Commit() {
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
    entries.erase(std::remove_if(entries.begin(), entries.end(),
                                 [&](const EntryPut& e) REQUIRES(mu_) { return !segments_->Contains(e.segment); }),
                  entries.end());
    segments_->CollectRecords(with_data, now_s, &records, &to_sync);
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
  segments_->RaiseDurable(records);
}

}  // namespace shardcache::cache
