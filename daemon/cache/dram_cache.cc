#include "daemon/cache/dram_cache.h"

namespace shardcache::cache {

ChunkPtr DramCache::Get(const ChunkKey& key) {
  MutexLock lock(&mu_);
  auto it = map_.find(key);
  if (it == map_.end()) return nullptr;
  lru_.splice(lru_.begin(), lru_, it->second);
  return it->second->chunk;
}

bool DramCache::Contains(const ChunkKey& key) const {
  MutexLock lock(&mu_);
  return map_.count(key) > 0;
}

void DramCache::Put(const ChunkKey& key, ChunkPtr chunk) {
  if (!chunk) return;
  MutexLock lock(&mu_);
  const uint64_t bytes = chunk->bytes.size();
  if (bytes > budget_bytes_) return;
  auto it = map_.find(key);
  if (it != map_.end()) {
    used_bytes_ -= it->second->chunk->bytes.size();
    it->second->chunk = std::move(chunk);
    used_bytes_ += bytes;
    lru_.splice(lru_.begin(), lru_, it->second);
  } else {
    lru_.push_front(Entry{key, std::move(chunk)});
    map_.emplace(key, lru_.begin());
    used_bytes_ += bytes;
  }
  EvictLocked();
}

void DramCache::Erase(const ChunkKey& key) {
  MutexLock lock(&mu_);
  auto it = map_.find(key);
  if (it == map_.end()) return;
  used_bytes_ -= it->second->chunk->bytes.size();
  lru_.erase(it->second);
  map_.erase(it);
}

void DramCache::EraseVersion(const Hash128& version) {
  MutexLock lock(&mu_);
  for (auto it = lru_.begin(); it != lru_.end();) {
    if (it->key.version == version) {
      used_bytes_ -= it->chunk->bytes.size();
      map_.erase(it->key);
      it = lru_.erase(it);
    } else {
      ++it;
    }
  }
}

void DramCache::SetBudget(uint64_t budget_bytes) {
  MutexLock lock(&mu_);
  budget_bytes_ = budget_bytes;
  EvictLocked();
}

void DramCache::EvictLocked() {
  while (used_bytes_ > budget_bytes_ && !lru_.empty()) {
    Entry& victim = lru_.back();
    used_bytes_ -= victim.chunk->bytes.size();
    map_.erase(victim.key);
    lru_.pop_back();
  }
}

uint64_t DramCache::used_bytes() const {
  MutexLock lock(&mu_);
  return used_bytes_;
}
uint64_t DramCache::budget_bytes() const {
  MutexLock lock(&mu_);
  return budget_bytes_;
}
size_t DramCache::entries() const {
  MutexLock lock(&mu_);
  return map_.size();
}

}  // namespace shardcache::cache
