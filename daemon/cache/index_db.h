// IndexDb: the NVMe tier's durable index in RocksDB — metadata only, never chunk bytes.
//
// Key space (default column family, keys compare bytewise):
//
//   "F"                               -> format version, ASCII decimal (kIndexFormatVersion)
//   "S" be32(segment id)              -> SegmentRecord   (one per segment file seg-<id>.dat)
//   "C" be32(segment id) be64(offset) -> EntryRecord     (one per chunk stored in a segment)
//   "M" dataset name                  -> manifest bytes last seen from upstream
//   "X" version "/" shard             -> serialized SampleIndex last seen from upstream
// (M and X let a restarted node keep serving cached data while its upstream is down.)
//
// Entries are keyed by *location*, not by chunk key: all entries of a segment are one key
// range, so evicting a segment is one DeleteRange, and start-up reads them in disk order. The
// chunk key lives in the value; the in-memory ChunkIndex (chunk_index.h) maps chunk →
// location.
//
// Durability protocol (see nvme_writer.h): an EntryRecord is written only after the bytes it
// points at were fdatasync'ed, in the same synced WriteBatch that raises the segment's
// durable_bytes watermark. At start-up an entry is trusted only if its extent lies below its
// segment's watermark and the segment file is at least that long.
//
// Thread safety: RocksDB is thread-safe; IndexDb adds no state beyond the DB handle.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/hash.h"
#include "common/status.h"

namespace rocksdb {
class DB;
class Status;
}  // namespace rocksdb

namespace shardcache::cache {

// 2: each chunk's extent ends with a block table (extent.h); version 1 caches had none.
constexpr uint32_t kIndexFormatVersion = 2;

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "records are stored little-endian");

// Value of an "S" key.
//
//   0               8               16      20      24
//   +---------------+---------------+-------+-------+
//   | durable_bytes | last_access_s | flags | rsvd  |
//   +---------------+---------------+-------+-------+
struct SegmentRecord {
  uint64_t durable_bytes = 0;   // bytes at the front of the file that are synced and indexed
  uint64_t last_access_s = 0;   // unix seconds of the last read or write (for lru after restart)
  uint32_t flags = 0;           // kSegmentSealed
  uint32_t reserved = 0;
};
static_assert(sizeof(SegmentRecord) == 24);
constexpr uint32_t kSegmentSealed = 1;

// Value of a "C" key.
//
//   0    1    4        8                24      28     32        40               56
//   +----+----+--------+----------------+-------+------+---------+----------------+
//   |fmt |rsvd| length | version id     | shard | rsvd | chunk   | xxh3-128 hash  |
//   +----+----+--------+----------------+-------+------+---------+----------------+
struct EntryRecord {
  uint8_t format = 1;
  uint8_t reserved0[3] = {0, 0, 0};
  uint32_t length = 0;          // chunk bytes (extent on disk: ExtentBytes in extent.h)
  uint64_t version_high = 0;
  uint64_t version_low = 0;
  uint32_t shard = 0;
  uint32_t reserved1 = 0;
  uint64_t chunk = 0;
  uint64_t hash_high = 0;
  uint64_t hash_low = 0;
};
static_assert(sizeof(EntryRecord) == 56);

struct EntryPut {
  uint32_t segment = 0;
  uint64_t offset = 0;
  EntryRecord record;
};

struct EntryLocation {
  uint32_t segment = 0;
  uint64_t offset = 0;
};

class IndexDb {
 public:
  // Opens (creating when missing) the RocksDB at `path`. FailedPrecondition when the stored
  // format version differs; the error names the path. While another process holds the
  // index's LOCK, retries for up to kLockWait.
  static Result<std::unique_ptr<IndexDb>> Open(const std::string& path, uint64_t block_cache_bytes);
  static constexpr std::chrono::seconds kLockWait{60};
  ~IndexDb();

  // Calls fn for every segment record, in id order.
  Status ForEachSegment(const std::function<void(uint32_t id, const SegmentRecord&)>& fn);
  // Calls fn for every entry, in (segment, offset) order. A malformed value is reported through
  // `bad` (with its location) instead, so the caller can drop it.
  Status ForEachEntry(const std::function<void(const EntryLocation&, const EntryRecord&)>& fn,
                      const std::function<void(const EntryLocation&)>& bad);

  // One synced WriteBatch: entry puts, segment record updates. After a background error
  // (e.g. ENOSPC) the DB is resumed once and the write retried.
  Status Commit(const std::vector<EntryPut>& entries,
                const std::vector<std::pair<uint32_t, SegmentRecord>>& segments, bool sync);
  // Removes a segment record and all its entries (one DeleteRange), synced.
  Status DropSegment(uint32_t id);
  // Removes individual entries (checksum failures, dataset eviction). Not synced: an entry that
  // reappears after a crash is verified again on read.
  Status DropEntries(const std::vector<EntryLocation>& locations);

  // Small metadata blobs ("M"/"X" keys). Get returns NotFound when absent. Put is not synced.
  Status PutBlob(const std::string& key, const std::string& value);
  Result<std::string> GetBlob(const std::string& key);

  // RocksDB's estimate of the number of keys (to size the in-memory map before loading).
  uint64_t EstimateKeys() const;

  // Allocated bytes of the index directory (st_blocks), for the budget.
  uint64_t DiskBytes() const;
  // Memory RocksDB holds for the index: memtables, block cache, table readers. Bounded by
  // the options Open sets (2 memtables of 4 MiB, the block cache) plus the readers.
  uint64_t MemoryBytes() const;
  const std::string& path() const { return path_; }

 private:
  IndexDb(std::string path, rocksdb::DB* db);
  Status Write(const std::function<void(void* batch)>& fill, bool sync, const char* what);

  const std::string path_;
  std::unique_ptr<rocksdb::DB> db_;
};

// Adapter for rocksdb::Status; the message names `what` and the index path.
Status FromRocks(const rocksdb::Status& s, const std::string& what);

}  // namespace shardcache::cache
