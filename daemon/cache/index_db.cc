#include "daemon/cache/index_db.h"

#include <dirent.h>
#include <sys/stat.h>

#include <chrono>
#include <cstring>
#include <thread>

#include <rocksdb/cache.h>
#include <rocksdb/db.h>
#include <rocksdb/table.h>
#include <rocksdb/write_batch.h>
#include <spdlog/spdlog.h>


namespace shardcache::cache {
namespace {

constexpr char kFormatKey[] = "F";

void PutBe32(std::string* s, uint32_t v) {
  for (int i = 3; i >= 0; --i) s->push_back(static_cast<char>((v >> (i * 8)) & 0xff));
}
void PutBe64(std::string* s, uint64_t v) {
  for (int i = 7; i >= 0; --i) s->push_back(static_cast<char>((v >> (i * 8)) & 0xff));
}
uint64_t GetBe(const char* p, int n) {
  uint64_t v = 0;
  for (int i = 0; i < n; ++i) v = (v << 8) | static_cast<uint8_t>(p[i]);
  return v;
}

std::string SegmentKey(uint32_t id) {
  std::string k = "S";
  PutBe32(&k, id);
  return k;
}
std::string EntryKey(uint32_t segment, uint64_t offset) {
  std::string k = "C";
  PutBe32(&k, segment);
  PutBe64(&k, offset);
  return k;
}
std::string EntryPrefix(uint32_t segment) {
  std::string k = "C";
  PutBe32(&k, segment);
  return k;
}

// RocksDB's refusal of a LOCK another process (or another handle here) holds.
bool LockHeld(const rocksdb::Status& s) {
  return s.IsIOError() && s.ToString().find("lock") != std::string::npos;
}

}  // namespace

Status FromRocks(const rocksdb::Status& s, const std::string& what) {
  if (s.ok()) return Status::Ok();
  const std::string msg = what + ": " + s.ToString();
  if (s.IsNoSpace()) return ResourceExhausted(msg);
  if (s.IsNotFound()) return NotFound(msg);
  if (s.IsCorruption()) return DataLoss(msg);
  if (s.IsBusy() || s.IsTryAgain() || s.IsTimedOut()) return Unavailable(msg);
  return Internal(msg);
}

IndexDb::IndexDb(std::string path, rocksdb::DB* db) : path_(std::move(path)), db_(db) {}

IndexDb::~IndexDb() {
  if (db_) {
    rocksdb::Status s = db_->Close();
    if (!s.ok()) spdlog::warn("closing cache index {}: {}", path_, s.ToString());
  }
}

Result<std::unique_ptr<IndexDb>> IndexDb::Open(const std::string& path, uint64_t block_cache_bytes) {
  rocksdb::Options options;
  options.create_if_missing = true;
  // Keep the index's own footprint small and bounded: it counts against cache.size.
  options.info_log_level = rocksdb::InfoLogLevel::WARN_LEVEL;
  options.max_log_file_size = 1 << 20;
  options.keep_log_file_num = 2;
  // The memtable grows with every chunk stored or dropped until it is flushed, so its size is
  // memory the daemon holds for good once the cache has churned long enough: a 1-hour soak
  // measured it filling 0.5 -> 4 MiB (most of that run's RSS drift) with 4 MiB buffers. An
  // index entry is ~50 bytes, so 1 MiB still holds ~20,000 writes between flushes.
  options.write_buffer_size = 1 << 20;
  options.max_write_buffer_number = 2;
  options.max_total_wal_size = 4 << 20;
  options.max_manifest_file_size = 4 << 20;
  // Preallocation would make the index look 4+ MiB larger to du than it is.
  options.allow_fallocate = false;
  options.manifest_preallocation_size = 64 << 10;
  options.max_background_jobs = 2;
  options.avoid_unnecessary_blocking_io = true;
  rocksdb::BlockBasedTableOptions table;
  table.block_cache = rocksdb::NewLRUCache(block_cache_bytes == 0 ? (1 << 20) : block_cache_bytes);
  options.table_factory.reset(rocksdb::NewBlockBasedTableFactory(table));

  rocksdb::DB* raw = nullptr;
  rocksdb::Status s = rocksdb::DB::Open(options, path, &raw);
  // A predecessor that is still stopping (a restart or a rolling update that overlaps it) holds
  // the index's LOCK for a moment: wait for it instead of failing the start. It exits within
  // its stop bound (shardcached: 30 s), so the wait is longer than that.
  const auto give_up = std::chrono::steady_clock::now() + kLockWait;
  for (bool logged = false; !s.ok() && LockHeld(s) && std::chrono::steady_clock::now() < give_up;) {
    if (!logged) {
      spdlog::warn("cache index {} is locked by another process (a shardcached still stopping?); waiting up to {} s",
                   path, std::chrono::duration_cast<std::chrono::seconds>(kLockWait).count());
      logged = true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    s = rocksdb::DB::Open(options, path, &raw);
  }
  if (!s.ok()) return FromRocks(s, "opening cache index " + path);
  std::unique_ptr<IndexDb> db(new IndexDb(path, raw));

  std::string value;
  s = raw->Get(rocksdb::ReadOptions(), kFormatKey, &value);
  if (s.IsNotFound()) {
    rocksdb::WriteOptions wo;
    wo.sync = true;
    s = raw->Put(wo, kFormatKey, std::to_string(kIndexFormatVersion));
    if (!s.ok()) return FromRocks(s, "writing format version to cache index " + path);
  } else if (!s.ok()) {
    return FromRocks(s, "reading format version of cache index " + path);
  } else if (value != std::to_string(kIndexFormatVersion)) {
    return FailedPrecondition("cache index " + path + " has format version '" + value +
                              "', this build reads version " + std::to_string(kIndexFormatVersion) +
                              "; remove the cache directory to start empty");
  }
  return db;
}

Status IndexDb::ForEachSegment(const std::function<void(uint32_t, const SegmentRecord&)>& fn) {
  rocksdb::ReadOptions ro;
  ro.fill_cache = false;
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(ro));
  for (it->Seek("S"); it->Valid() && it->key().starts_with("S"); it->Next()) {
    const auto k = it->key();
    const auto v = it->value();
    if (k.size() != 5 || v.size() != sizeof(SegmentRecord)) {
      spdlog::warn("cache index {}: ignoring malformed segment record (key {} bytes, value {} bytes)",
                   path_, k.size(), v.size());
      continue;
    }
    SegmentRecord rec;
    std::memcpy(&rec, v.data(), sizeof(rec));
    fn(static_cast<uint32_t>(GetBe(k.data() + 1, 4)), rec);
  }
  return FromRocks(it->status(), "reading segment records of cache index " + path_);
}

Status IndexDb::ForEachEntry(const std::function<void(const EntryLocation&, const EntryRecord&)>& fn,
                             const std::function<void(const EntryLocation&)>& bad) {
  rocksdb::ReadOptions ro;
  ro.fill_cache = false;
  ro.readahead_size = 4 << 20;
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(ro));
  for (it->Seek("C"); it->Valid() && it->key().starts_with("C"); it->Next()) {
    const auto k = it->key();
    const auto v = it->value();
    if (k.size() != 13) continue;  // cannot even name a location; leave it (harmless)
    EntryLocation loc{static_cast<uint32_t>(GetBe(k.data() + 1, 4)), GetBe(k.data() + 5, 8)};
    if (v.size() != sizeof(EntryRecord) || static_cast<uint8_t>(v[0]) != 1) {
      bad(loc);
      continue;
    }
    EntryRecord rec;
    std::memcpy(&rec, v.data(), sizeof(rec));
    fn(loc, rec);
  }
  return FromRocks(it->status(), "reading entries of cache index " + path_);
}

Status IndexDb::Write(const std::function<void(void*)>& fill, bool sync, const char* what) {
  rocksdb::WriteBatch batch;
  fill(&batch);
  rocksdb::WriteOptions wo;
  wo.sync = sync;
  rocksdb::Status s = db_->Write(wo, &batch);
  if (!s.ok()) {
    // After a background error (no space, I/O error) RocksDB is read-only until resumed. The
    // failure itself reaches the caller, whose disk health logs it once (disk_health.h).
    spdlog::debug("cache index {}: {} failed ({}); trying DB::Resume", path_, what, s.ToString());
    rocksdb::Status r = db_->Resume();
    if (r.ok()) s = db_->Write(wo, &batch);
  }
  return FromRocks(s, std::string(what) + " in cache index " + path_);
}

Status IndexDb::Commit(const std::vector<EntryPut>& entries,
                       const std::vector<std::pair<uint32_t, SegmentRecord>>& segments, bool sync) {
  return Write(
      [&](void* b) {
        auto* batch = static_cast<rocksdb::WriteBatch*>(b);
        for (const auto& e : entries) {
          batch->Put(EntryKey(e.segment, e.offset),
                     rocksdb::Slice(reinterpret_cast<const char*>(&e.record), sizeof(e.record)));
        }
        for (const auto& [id, rec] : segments) {
          batch->Put(SegmentKey(id), rocksdb::Slice(reinterpret_cast<const char*>(&rec), sizeof(rec)));
        }
      },
      sync, "commit");
}

Status IndexDb::DropSegment(uint32_t id) {
  return Write(
      [&](void* b) {
        auto* batch = static_cast<rocksdb::WriteBatch*>(b);
        batch->DeleteRange(EntryPrefix(id), EntryPrefix(id + 1));
        batch->Delete(SegmentKey(id));
      },
      true, "dropping a segment");
}

Status IndexDb::DropEntries(const std::vector<EntryLocation>& locations) {
  if (locations.empty()) return Status::Ok();
  return Write(
      [&](void* b) {
        auto* batch = static_cast<rocksdb::WriteBatch*>(b);
        for (const auto& l : locations) batch->Delete(EntryKey(l.segment, l.offset));
      },
      false, "dropping entries");
}

Status IndexDb::PutBlob(const std::string& key, const std::string& value) {
  return Write([&](void* b) { static_cast<rocksdb::WriteBatch*>(b)->Put(key, value); }, false,
               "storing metadata");
}

Result<std::string> IndexDb::GetBlob(const std::string& key) {
  std::string value;
  rocksdb::Status s = db_->Get(rocksdb::ReadOptions(), key, &value);
  if (!s.ok()) return FromRocks(s, "reading metadata");
  return value;
}

uint64_t IndexDb::EstimateKeys() const {
  uint64_t n = 0;
  if (!db_->GetIntProperty("rocksdb.estimate-num-keys", &n)) return 0;
  return n;
}

uint64_t IndexDb::MemoryBytes() const {
  uint64_t total = 0;
  for (const char* p : {"rocksdb.cur-size-all-mem-tables", "rocksdb.block-cache-usage",
                        "rocksdb.estimate-table-readers-mem"}) {
    uint64_t v = 0;
    if (db_->GetIntProperty(p, &v)) total += v;
  }
  return total;
}

uint64_t IndexDb::DiskBytes() const {
  uint64_t total = 0;
  DIR* d = opendir(path_.c_str());
  if (d == nullptr) return 0;
  struct stat st;
  if (stat(path_.c_str(), &st) == 0) total += static_cast<uint64_t>(st.st_blocks) * 512;
  while (dirent* e = readdir(d)) {
    if (std::strcmp(e->d_name, ".") == 0 || std::strcmp(e->d_name, "..") == 0) continue;
    const std::string p = path_ + "/" + e->d_name;
    if (stat(p.c_str(), &st) == 0) total += static_cast<uint64_t>(st.st_blocks) * 512;
  }
  closedir(d);
  return total;
}

}  // namespace shardcache::cache
