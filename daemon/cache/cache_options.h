// CacheOptions: every knob of the cache tiers (DRAM + NVMe) in one struct with in-class
// defaults — the one place each default is written — validated once by Validate(). config/
// embeds it as Config::cache and parses the [cache] keys into it with the parsers below; tests
// and tools fill it directly.
//
// Thread safety: a plain value.
#pragma once

#include <cstdint>
#include <string>

#include "common/status.h"

namespace shardcache::cache {

enum class EvictionPolicyKind {
  kLru,          // evict the segment touched least recently
  kStatic,       // fill until full, then admit nothing new (no churn)
  kClairvoyant,  // evict the segment whose next planned use is furthest away (see access_plan.h)
};

// "lru" | "static" | "clairvoyant"; InvalidArgument naming the text otherwise.
Result<EvictionPolicyKind> ParseEvictionPolicy(const std::string& text);
const char* EvictionPolicyName(EvictionPolicyKind kind);

// Free-space floor on the cache file system: a fraction of its size or a byte count, whichever
// is larger (ParseMinFree sets one and zeroes the other).
struct MinFree {
  double fraction = 0.05;
  uint64_t bytes = 0;
  // Bytes to keep free on a file system of `fs_bytes`.
  uint64_t BytesFor(uint64_t fs_bytes) const;
  bool operator==(const MinFree&) const = default;
};
// "5%" (a percentage in [0, 100)) or a byte size ("10GiB"); InvalidArgument quoting the text.
Result<MinFree> ParseMinFree(const std::string& text);

struct CacheOptions {
  // Directory holding the segment files (seg-<id>.dat) and the RocksDB index (index/).
  // Created when missing, unless require_mount. Required when size_bytes > 0.
  std::string dir;

  // Refuse to open unless `dir` is a mount point of its own (see cache_dir.h); never create
  // it. Default: false.
  bool require_mount = false;

  // Hard budget for everything under `dir`, in allocated bytes: segment files plus the RocksDB
  // index. 0 = no NVMe tier (pass-through with single-flight and the DRAM tier only).
  // Run-time changeable with CachedSource::SetSizeBytes (shrinking evicts while serving).
  // Default: 0.
  uint64_t size_bytes = 0;

  // DRAM tier budget in bytes of chunk payload. 0 = no DRAM tier. Default: 256 MiB.
  uint64_t memory_bytes = 256ull << 20;

  // Free-space floor on the file system holding `dir`: the cache never allocates a segment that
  // would leave less free than min_free.BytesFor(fs size), and gives segments back (unlinks
  // them) when other files eat into the floor. Default: 5 %.
  MinFree min_free;

  EvictionPolicyKind eviction = EvictionPolicyKind::kLru;

  // Size of one segment file, the unit of allocation and eviction. Multiple of 4 KiB. A chunk
  // whose extent (ExtentBytes in extent.h) is larger is served but never stored (counted in
  // shardcache_cache_unstored_chunks_total); config/ refuses segments below two default-sized
  // chunks. Not changeable at run time (existing segments keep their size). Default: 256 MiB.
  uint64_t segment_bytes = 256ull << 20;

  // Bytes of the budget set aside for the RocksDB index (SST files, WAL, MANIFEST). 0 = auto:
  // 8 MiB + size_bytes / 512. The real index size is also measured at every segment roll and a
  // segment is evicted when segments + measured index would exceed size_bytes.
  uint64_t index_reserve_bytes = 0;

  // Group commit: entries of written chunks are committed to RocksDB (after fdatasync of the
  // segment) once this many bytes are pending, when a segment is sealed, when the write queue
  // runs empty (not within 50 ms of the last commit), or after commit_interval_ms. Default:
  // 64 MiB / 200 ms.
  uint64_t commit_bytes = 64ull << 20;
  uint32_t commit_interval_ms = 200;

  // The writer's housekeeping. When idle it wakes every writer_idle_tick_ms to give space back
  // if the free-space floor is hit and to probe the disk (disk_health.h); while busy it probes
  // at most every disk_probe_interval_ms. Segments' access times (the LRU order a restart
  // recovers) are persisted after access_persist_interval_ms of idleness. After ENOSPC, or a
  // segment that could not be created, no new segment is tried for nospace_backoff_ms.
  // Defaults: 1 s, 1 s, 10 s, 1 s.
  uint32_t writer_idle_tick_ms = 1000;
  uint32_t disk_probe_interval_ms = 1000;
  uint32_t access_persist_interval_ms = 10000;
  uint32_t nospace_backoff_ms = 1000;

  // Chunks waiting for the NVMe writer; readers block (back-pressure) above this. Default 256 MiB.
  uint64_t write_queue_bytes = 256ull << 20;

  // Largest run of missing chunks fetched from upstream in one range call. Default: 64.
  uint32_t max_fetch_run_chunks = 64;

  // io_uring for NVMe reads; when false, or when io_uring_setup is refused (seccomp), pread.
  bool use_io_uring = true;

  // RocksDB block cache for the index (the index is held in memory, so small). Default 8 MiB.
  uint64_t index_block_cache_bytes = 8ull << 20;

  // Checks ranges and required fields; InvalidArgument naming the option otherwise.
  Status Validate() const;
  // Reserve actually used for the index (resolves the 0 = auto default).
  uint64_t EffectiveIndexReserve() const;

  bool operator==(const CacheOptions&) const = default;
};

}  // namespace shardcache::cache
