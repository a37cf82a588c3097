// NVMe tier start-up: rebuilding the SegmentManager's table and the ChunkIndex from the RocksDB
// index (index_db.h), and setting aside an index that cannot be read.
//
// Recovery reads the index, not the segments: segment records and entries are iterated,
// entries beyond a segment's durable watermark or in a missing/short file are dropped, segment
// files without a record (created, then a crash before their first commit) are deleted. Every
// surviving segment is sealed (new chunks go to new segments) and ordered by its persisted last
// access for lru. Because the writer makes data durable before its entry (nvme_writer.h), what
// survives points at whole, synced bytes; every read is still verified.
//
// An index that cannot be read as it is (corrupt files, another format, an I/O error) is set
// aside and the cache starts empty: it is only a cache, and refusing to start would make a
// restart loop of one bad disk sector. Refusals that a fresh index would meet as well
// (permissions, a full disk, a LOCK held) stay errors.
//
// Thread safety: Recover runs before the store is shared; NvmeStore holds its mutex around it
// for the analysis only. The other functions are plain file-system work.
#pragma once

#include <cstdint>
#include <string>

#include "common/status.h"
#include "daemon/cache/chunk_index.h"
#include "daemon/cache/index_db.h"
#include "daemon/cache/segment_manager.h"

namespace shardcache::cache {

struct RecoveryStats {
  uint64_t segments = 0;
  uint64_t entries = 0;
  uint64_t dropped_entries = 0;    // beyond watermark, missing segment, malformed
  uint64_t dropped_segments = 0;   // file missing or shorter than its watermark
  uint64_t orphan_files = 0;       // segment files without a record (crash before first commit)
  double seconds = 0;
};

// Removes orphan segment files in `dir`, opens the recorded segments into `segments` and loads
// the entries into `index` (both empty before), dropping from `db` what cannot be trusted (see
// above). Sets the next segment id past every id seen and the measured index size.
Status Recover(const std::string& dir, IndexDb& db, ChunkIndex* index, SegmentManager* segments,
               RecoveryStats* stats);

// True when `s`, from opening or recovering the index, means the index itself is unusable and
// is to be set aside (data loss, another format, corrupt or malformed contents).
bool IndexUnusable(const Status& s);

// Set-aside indexes kept for diagnosis; older ones are removed.
constexpr size_t kKeptUnreadableIndexes = 2;

// Renames dir/index to dir/index.unreadable-<UTC time> with an error line naming `why`, counts
// it (shardcache_cache_index_resets_total) and keeps the newest kKeptUnreadableIndexes of those.
Status SetIndexAside(const std::string& dir, const Status& why);

}  // namespace shardcache::cache
