// BlockTables: the block tables (common/hash.h) of chunks whose ranges this node fetched, each
// checked against its manifest Merkle root before it was put here, so a later range of the same
// chunk is fetched without its table. Least recently used tables go first once their bytes pass
// the budget (a 4 MiB chunk's table is 4 KiB: the default 32 MiB covers 32 GiB of chunks).
//
// Thread safety: all methods are thread-safe.
#pragma once

#include <cstdint>
#include <chrono>
#include <list>
#include <memory>
#include <string>
#include <unordered_map>

#include "common/hash.h"
#include "common/mutex.h"
#include "common/status.h"
#include "daemon/source/chunk_key.h"

namespace shardcache::upstream {

using BlockTablePtr = std::shared_ptr<const std::string>;

// Checks that `table` is the block table of a chunk of `chunk_length` bytes whose manifest hash
// is `root`; DataLoss naming `where` otherwise.
Status CheckBlockTable(std::string_view table, uint64_t chunk_length, const Hash128& root, const std::string& where);
// Checks `size` bytes at `data`, blocks from `first_block` on, against their entries in a
// verified `table`; DataLoss naming `where` and the first block that differs.
Status CheckBlocks(std::string_view table, uint64_t first_block, const uint8_t* data, uint64_t size,
                   const std::string& where);

class BlockTables {
 public:
  explicit BlockTables(uint64_t budget_bytes = 32ull << 20) : budget_bytes_(budget_bytes) {}

  // The table of `key`, or null.
  BlockTablePtr Get(const ChunkKey& key);
  // Remembers a verified table.
  void Put(const ChunkKey& key, BlockTablePtr table);
  uint64_t bytes() const;

  // Asking for a table once: many ranges of one chunk fetched at once (a global shuffle's warm
  // reads) would otherwise each bring the chunk's table, ~6% more bytes on the link. Claim is
  // true when the caller should ask for `key`'s table: it is not known and nobody claimed it
  // within `ttl` (the claim is then the caller's). WaitFor returns the table once it is put,
  // or null at `deadline`.
  bool Claim(const ChunkKey& key, std::chrono::steady_clock::duration ttl);
  BlockTablePtr WaitFor(const ChunkKey& key, std::chrono::steady_clock::time_point deadline);

 private:
  using Lru = std::list<std::pair<ChunkKey, BlockTablePtr>>;
  const uint64_t budget_bytes_;
  mutable Mutex mu_;
  Lru lru_ GUARDED_BY(mu_);  // most recently used first
  std::unordered_map<ChunkKey, Lru::iterator, ChunkKeyHash> by_key_ GUARDED_BY(mu_);
  uint64_t bytes_ GUARDED_BY(mu_) = 0;
  CondVar put_;  // a table was put
  std::unordered_map<ChunkKey, std::chrono::steady_clock::time_point, ChunkKeyHash> claims_ GUARDED_BY(mu_);
};

}  // namespace shardcache::upstream
