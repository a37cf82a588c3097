// DramCache: the DRAM tier — a byte-budgeted LRU of verified chunks (ChunkPtr) in front of the
// NVMe tier. Entries are shared pointers, so a hit hands out the same immutable bytes without
// a copy; an evicted chunk lives on while a reader still holds it (its bytes then no longer
// count against the budget).
//
// Keys are full ChunkKeys (not fingerprints): the DRAM tier serves without re-hashing, so it
// must never confuse two chunks.
//
// Thread safety: all methods are safe from any thread (one mutex; no I/O under it).
#pragma once

#include <cstdint>
#include <list>
#include <unordered_map>

#include "common/mutex.h"
#include "daemon/source/chunk_key.h"
#include "daemon/source/chunk_source.h"

namespace shardcache::cache {

class DramCache {
 public:
  explicit DramCache(uint64_t budget_bytes) : budget_bytes_(budget_bytes) {}

  // The chunk, refreshed as most recently used, or nullptr.
  ChunkPtr Get(const ChunkKey& key);
  // Whether the chunk is held, without refreshing it (a prefetcher's check must not make a
  // chunk needed later outlive one needed sooner).
  bool Contains(const ChunkKey& key) const;
  // Inserts (or refreshes) `chunk`; evicts least recently used chunks until within budget.
  // A chunk larger than the whole budget is not kept.
  void Put(const ChunkKey& key, ChunkPtr chunk);
  void Erase(const ChunkKey& key);
  // Drops every chunk of one dataset version.
  void EraseVersion(const Hash128& version);

  // Shrinking evicts at once.
  void SetBudget(uint64_t budget_bytes);
  uint64_t used_bytes() const;
  uint64_t budget_bytes() const;
  size_t entries() const;

 private:
  struct Entry {
    ChunkKey key;
    ChunkPtr chunk;
  };
  void EvictLocked() REQUIRES(mu_);

  mutable Mutex mu_;
  uint64_t budget_bytes_ GUARDED_BY(mu_);
  uint64_t used_bytes_ GUARDED_BY(mu_) = 0;
  std::list<Entry> lru_ GUARDED_BY(mu_);  // front = most recent
  std::unordered_map<ChunkKey, std::list<Entry>::iterator, ChunkKeyHash> map_ GUARDED_BY(mu_);
};

}  // namespace shardcache::cache
