#include "daemon/upstream/block_tables.h"

#include <algorithm>

namespace shardcache::upstream {

Status CheckBlockTable(std::string_view table, uint64_t chunk_length, const Hash128& root, const std::string& where) {
  if (table.size() != ChunkBlockCount(chunk_length) * kBlockHashBytes || RootOfBlockTable(table) != root) {
    return DataLoss(where + ": the block table (" + std::to_string(table.size()) +
                    " bytes) does not match the manifest's chunk hash " + root.ToHex());
  }
  return Status::Ok();
}

Status CheckBlocks(std::string_view table, uint64_t first_block, const uint8_t* data, uint64_t size,
                   const std::string& where) {
  for (uint64_t off = 0, b = first_block; off < size; off += kChunkBlockBytes, ++b) {
    if ((b + 1) * kBlockHashBytes > table.size()) {
      return DataLoss(where + ": block " + std::to_string(b) + " lies past the chunk's block table");
    }
    const Hash128 got = HashBytes(data + off, std::min<uint64_t>(kChunkBlockBytes, size - off));
    if (got != BlockTableEntry(table, b)) {
      return DataLoss(where + ": block " + std::to_string(b) + " hashes to " + got.ToHex() +
                      ", its block table says " + BlockTableEntry(table, b).ToHex());
    }
  }
  return Status::Ok();
}

BlockTablePtr BlockTables::Get(const ChunkKey& key) {
  MutexLock lock(&mu_);
  auto it = by_key_.find(key);
  if (it == by_key_.end()) return nullptr;
  lru_.splice(lru_.begin(), lru_, it->second);
  return it->second->second;
}

void BlockTables::Put(const ChunkKey& key, BlockTablePtr table) {
  MutexLock lock(&mu_);
  if (auto it = by_key_.find(key); it != by_key_.end()) {
    bytes_ -= it->second->second->size();
    lru_.erase(it->second);
    by_key_.erase(it);
  }
  bytes_ += table->size();
  lru_.emplace_front(key, std::move(table));
  by_key_[key] = lru_.begin();
  while (bytes_ > budget_bytes_ && lru_.size() > 1) {
    bytes_ -= lru_.back().second->size();
    by_key_.erase(lru_.back().first);
    lru_.pop_back();
  }
  claims_.erase(key);
  put_.NotifyAll();
}

bool BlockTables::Claim(const ChunkKey& key, std::chrono::steady_clock::duration ttl) {
  const auto now = std::chrono::steady_clock::now();
  MutexLock lock(&mu_);
  if (by_key_.count(key) > 0) return false;
  // Claims whose table never came (a failed stream) lapse; the map stays small.
  constexpr size_t kPruneAbove = 4096;
  if (claims_.size() > kPruneAbove) std::erase_if(claims_, [&](const auto& c) { return now - c.second >= ttl; });
  auto [it, fresh] = claims_.try_emplace(key, now);
  if (!fresh && now - it->second < ttl) return false;
  it->second = now;
  return true;
}

BlockTablePtr BlockTables::WaitFor(const ChunkKey& key, std::chrono::steady_clock::time_point deadline) {
  MutexLock lock(&mu_);
  BlockTablePtr found;
  put_.WaitUntil(&mu_, deadline, [&]() REQUIRES(mu_) {
    auto it = by_key_.find(key);
    if (it != by_key_.end()) found = it->second->second;
    return found != nullptr;
  });
  return found;
}

uint64_t BlockTables::bytes() const {
  MutexLock lock(&mu_);
  return bytes_;
}

}  // namespace shardcache::upstream
