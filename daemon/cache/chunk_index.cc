#include "daemon/cache/chunk_index.h"

#include <algorithm>

namespace shardcache::cache {

std::optional<Loc> ChunkIndex::Find(uint64_t fp) const {
  auto it = map_.find(fp);
  if (it == map_.end()) return std::nullopt;
  return it->second;
}

bool ChunkIndex::Put(uint64_t fp, const Loc& loc) {
  auto [pos, inserted] = map_.try_emplace(fp, loc);
  if (!inserted) {
    Unlist(fp, pos->second.segment);
    pos->second = loc;
  }
  segments_[loc.segment].push_back(fp);
  return !inserted;
}

bool ChunkIndex::Drop(uint64_t fp, const Loc& loc) {
  auto it = map_.find(fp);
  if (it == map_.end() || !(it->second == loc)) return false;
  map_.erase(it);
  Unlist(fp, loc.segment);
  return true;
}

void ChunkIndex::RemoveSegment(uint32_t id) {
  auto seg = segments_.find(id);
  if (seg == segments_.end()) return;
  for (uint64_t fp : seg->second) {
    auto e = map_.find(fp);
    if (e != map_.end() && e->second.segment == id) map_.erase(e);
  }
  segments_.erase(seg);
}

const std::vector<uint64_t>* ChunkIndex::Fingerprints(uint32_t id) const {
  static const std::vector<uint64_t> kNone;
  auto seg = segments_.find(id);
  return seg == segments_.end() ? &kNone : &seg->second;
}

void ChunkIndex::Unlist(uint64_t fp, uint32_t id) {
  auto seg = segments_.find(id);
  if (seg == segments_.end()) return;
  auto& v = seg->second;
  auto it = std::find(v.begin(), v.end(), fp);
  if (it != v.end()) {
    *it = v.back();
    v.pop_back();
  }
}

}  // namespace shardcache::cache
