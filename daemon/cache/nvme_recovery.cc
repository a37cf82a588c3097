#include "daemon/cache/nvme_recovery.h"

#include <dirent.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <filesystem>
#include <map>
#include <set>
#include <vector>

#include <spdlog/spdlog.h>

#include "common/metrics.h"
#include "daemon/cache/extent.h"
#include "daemon/source/chunk_key.h"

namespace shardcache::cache {
namespace {

using Clock = std::chrono::steady_clock;

metrics::Counter* IndexResets() {
  static auto* c = metrics::Registry::Global().GetCounter(
      "shardcache_cache_index_resets_total", "Cache indexes set aside as unreadable at start (the cache started empty)");
  return c;
}

// Segment files in `dir` by id: a readdir, not a scan of their contents.
Status ListSegmentFiles(const std::string& dir, std::set<uint32_t>* files) {
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return ErrnoStatus(errno, "listing cache directory " + dir);
  while (dirent* e = readdir(d)) {
    uint32_t id;
    if (SegmentFile::ParseName(e->d_name, &id)) files->insert(id);
  }
  closedir(d);
  return Status::Ok();
}

// Opens each recorded segment (dropping one whose file is missing, unreadable or shorter than
// its durable watermark, with its entries) into `segments`, ordered by last access.
Status OpenRecordedSegments(const std::string& dir, IndexDb& db, const std::map<uint32_t, SegmentRecord>& records,
                            const std::set<uint32_t>& files, SegmentManager* segments, RecoveryStats* stats) {
  std::map<uint32_t, std::shared_ptr<SegmentFile>> opened;
  for (const auto& [id, rec] : records) {
    std::string problem;
    if (files.count(id) == 0) {
      problem = SegmentFile::PathFor(dir, id) + " is missing";
    } else if (auto file = SegmentFile::OpenExisting(dir, id); !file.ok()) {
      problem = file.status().ToString();
    } else if ((*file)->size_bytes() < rec.durable_bytes) {
      problem = (*file)->path() + " is " + std::to_string((*file)->size_bytes()) +
                " bytes, shorter than its durable watermark " + std::to_string(rec.durable_bytes);
    } else {
      opened[id] = std::move(*file);
      continue;
    }
    spdlog::warn("cache: dropping segment {} and its entries: {}", id, problem);
    SC_RETURN_IF_ERROR(db.DropSegment(id));
    ::unlink(SegmentFile::PathFor(dir, id).c_str());
    ++stats->dropped_segments;
  }
  // Order segments by their persisted last access for LRU ticks.
  std::vector<std::pair<uint64_t, uint32_t>> order;
  for (const auto& [id, file] : opened) order.emplace_back(records.at(id).last_access_s, id);
  std::sort(order.begin(), order.end());
  for (const auto& [when, id] : order) segments->AddRecovered(id, opened[id], records.at(id));
  return Status::Ok();
}

// Loads the index entries into `index`, dropping those that point past a durable watermark or
// into a missing segment.
Status LoadEntries(IndexDb& db, const SegmentManager& segments, ChunkIndex* index, RecoveryStats* stats) {
  std::vector<EntryLocation> drop;
  const auto t_entries = Clock::now();
  uint64_t duplicates = 0;
  index->Reserve(db.EstimateKeys());
  // Entries arrive in (segment, offset) order: remember the current segment's watermark.
  uint32_t cur = 0;
  std::optional<uint64_t> durable;
  Status s = db.ForEachEntry(
      [&](const EntryLocation& loc, const EntryRecord& e) {
        if (cur == 0 || cur != loc.segment) durable = segments.DurableBytes(cur = loc.segment);
        const uint64_t extent = ExtentBytes(e.length);
        if (!durable || loc.offset % kDirectIoAlign != 0 || e.length == 0 || loc.offset + extent > *durable) {
          drop.push_back(loc);
          return;
        }
        const ChunkKey key{Hash128{e.version_high, e.version_low}, e.shard, e.chunk};
        // The same chunk stored twice (refetched after a drop): the later copy wins.
        if (index->Put(Fingerprint(key), Loc{loc.segment, e.length, loc.offset})) ++duplicates;
        ++stats->entries;
      },
      [&](const EntryLocation& loc) { drop.push_back(loc); });
  SC_RETURN_IF_ERROR(s);
  spdlog::info("cache: index entries read in {:.3f} s ({} duplicates)",
               std::chrono::duration<double>(Clock::now() - t_entries).count(), duplicates);
  if (!drop.empty()) {
    spdlog::warn("cache: dropping {} index entries that point past a durable watermark or into a missing segment",
                 drop.size());
    SC_RETURN_IF_ERROR(db.DropEntries(drop));
  }
  stats->dropped_entries = drop.size();
  return Status::Ok();
}

}  // namespace

Status Recover(const std::string& dir, IndexDb& db, ChunkIndex* index, SegmentManager* segments,
               RecoveryStats* stats) {
  const auto t0 = Clock::now();
  std::map<uint32_t, SegmentRecord> records;
  SC_RETURN_IF_ERROR(db.ForEachSegment([&](uint32_t id, const SegmentRecord& r) { records[id] = r; }));
  std::set<uint32_t> files;
  SC_RETURN_IF_ERROR(ListSegmentFiles(dir, &files));
  uint32_t max_id = files.empty() ? 0 : *files.rbegin();
  if (!records.empty()) max_id = std::max(max_id, records.rbegin()->first);
  for (uint32_t id : files) {
    if (records.count(id) == 0) {
      // Created but never committed (crash before the first group commit): nothing points in.
      ::unlink(SegmentFile::PathFor(dir, id).c_str());
      ++stats->orphan_files;
    }
  }
  SC_RETURN_IF_ERROR(OpenRecordedSegments(dir, db, records, files, segments, stats));
  SC_RETURN_IF_ERROR(LoadEntries(db, *segments, index, stats));
  stats->segments = segments->count();
  segments->set_next_id(max_id + 1);
  segments->set_measured_index_bytes(db.DiskBytes());
  stats->seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  spdlog::info("cache: recovered {} chunks in {} segments from {} in {:.3f} s ({} entries and {} segments dropped, {} orphan files removed)",
               stats->entries, stats->segments, dir, stats->seconds, stats->dropped_entries,
               stats->dropped_segments, stats->orphan_files);
  return Status::Ok();
}

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

}  // namespace shardcache::cache
