#include "daemon/cache/segment_manager.h"

#include <algorithm>

namespace shardcache::cache {

SegmentManager::SegmentManager(const CacheOptions& options, uint64_t configured_size_bytes, EvictionPolicy* policy,
                               ChunkIndex* index)
    : segment_bytes_(options.segment_bytes),
      index_reserve_bytes_(options.EffectiveIndexReserve()),
      policy_(policy),
      index_(index),
      size_bytes_(options.size_bytes),
      configured_size_bytes_(configured_size_bytes) {}

uint64_t SegmentManager::IndexAllowance(uint64_t measured) const {
  return std::max(index_reserve_bytes_, measured + std::min(kIndexGrowthBytes, index_reserve_bytes_ / 2));
}

uint64_t SegmentManager::AllocatedBytes(size_t segments, uint64_t measured_index_bytes) const {
  return segments * segment_bytes_ + IndexAllowance(measured_index_bytes) + kDirOverheadBytes;
}

void SegmentManager::SetSize(uint64_t size_bytes, uint64_t configured_size_bytes) {
  size_bytes_ = size_bytes;
  configured_size_bytes_ = configured_size_bytes;
}

SegmentManager::Room SegmentManager::MakeRoom(uint64_t measured, int64_t headroom, uint64_t fp,
                                              std::vector<std::shared_ptr<SegmentFile>>* victims) {
  int64_t freed = 0;
  while (true) {
    const bool over_budget = AllocatedBytes(segments_.size() + 1, measured) > size_bytes_;
    // (headroom is INT64_MAX when the file system cannot be measured: headroom + freed would
    // overflow)
    const bool over_floor = headroom < static_cast<int64_t>(segment_bytes_) - freed;
    if (!over_budget && !over_floor) return Room::kMade;
    // Over the budget the policy may decline the chunk; short of disk space it must give a
    // segment back (forced), and with none left the chunk passes through.
    std::optional<uint32_t> victim = PickVictim(over_budget ? std::optional<uint64_t>(fp) : std::nullopt);
    if (!victim) return over_budget ? Room::kDeclined : Room::kDiskFull;
    victims->push_back(Evict(*victim));
    freed += static_cast<int64_t>(segment_bytes_);
  }
}

bool SegmentManager::DeclinesIntoFreedSpace(uint64_t fp) {
  const bool at_budget = AllocatedBytes(segments_.size() + 1, measured_index_bytes_) > size_bytes_;
  return at_budget && !policy_->AdmitIntoFreedSpace(fp);
}

bool SegmentManager::OverLimits(int64_t headroom) const {
  return AllocatedBytes(segments_.size(), measured_index_bytes_) > size_bytes_ || headroom < 0;
}

std::optional<uint32_t> SegmentManager::PickForcedVictim() {
  auto v = PickVictim(std::nullopt);
  // Only the open segment is left: it goes too.
  if (!v && open_ != 0) v = open_;
  return v;
}

std::optional<uint32_t> SegmentManager::PickVictim(std::optional<uint64_t> incoming) {
  std::vector<SegmentSummary> sealed;
  sealed.reserve(segments_.size());
  for (const auto& [id, s] : segments_) {
    if (id == open_) continue;
    sealed.push_back(SegmentSummary{id, s.last_tick, index_->Fingerprints(id)});
  }
  if (sealed.empty()) return std::nullopt;
  return policy_->PickVictim(sealed, incoming);
}

std::shared_ptr<SegmentFile> SegmentManager::Evict(uint32_t id) {
  auto it = segments_.find(id);
  if (it == segments_.end()) return nullptr;
  index_->RemoveSegment(id);
  auto file = std::move(it->second.file);
  segments_.erase(it);
  if (open_ == id) open_ = 0;
  ++evicted_;
  return file;
}

std::vector<std::shared_ptr<SegmentFile>> SegmentManager::EvictEmpty(const std::set<uint32_t>& ids) {
  std::vector<std::shared_ptr<SegmentFile>> victims;
  for (uint32_t id : ids) {
    if (Contains(id) && index_->Fingerprints(id)->empty() && id != open_) victims.push_back(Evict(id));
  }
  return victims;
}

bool SegmentManager::OpenHasRoom(uint64_t extent) const {
  if (open_ == 0) return false;
  return segments_.at(open_).write_offset + extent <= segment_bytes_;
}

void SegmentManager::SealOpen() {
  if (open_ == 0) return;
  Segment& s = segments_.at(open_);
  s.sealed = true;
  s.record_dirty = true;
  open_ = 0;
}

void SegmentManager::AddOpen(uint32_t id, std::shared_ptr<SegmentFile> file) {
  Segment seg;
  seg.file = std::move(file);
  seg.last_tick = ++tick_;
  seg.record_dirty = true;
  segments_.emplace(id, std::move(seg));
  open_ = id;
}

SegmentManager::Slot SegmentManager::Reserve(uint64_t extent) {
  Segment& s = segments_.at(open_);
  Slot slot{open_, s.write_offset, s.file};
  s.write_offset += extent;
  return slot;
}

void SegmentManager::SealAfterFailedWrite(uint32_t id, uint64_t offset) {
  auto it = segments_.find(id);
  if (it == segments_.end()) return;
  it->second.sealed = true;  // never write behind a failed extent
  it->second.write_offset = offset;
  if (open_ == id) open_ = 0;
}

void SegmentManager::AddRecovered(uint32_t id, std::shared_ptr<SegmentFile> file, const SegmentRecord& rec) {
  Segment seg;
  seg.file = std::move(file);
  seg.write_offset = rec.durable_bytes;
  seg.durable_bytes = rec.durable_bytes;
  seg.sealed = true;
  seg.last_tick = ++tick_;
  seg.record_dirty = (rec.flags & kSegmentSealed) == 0;
  segments_.emplace(id, std::move(seg));
}

std::optional<uint64_t> SegmentManager::DurableBytes(uint32_t id) const {
  auto it = segments_.find(id);
  if (it == segments_.end()) return std::nullopt;
  return it->second.durable_bytes;
}

std::shared_ptr<SegmentFile> SegmentManager::MarkRead(uint32_t id) {
  auto it = segments_.find(id);
  if (it == segments_.end()) return nullptr;
  it->second.last_tick = ++tick_;
  it->second.record_dirty = true;
  return it->second.file;
}

void SegmentManager::MarkWritten(uint32_t id) {
  auto it = segments_.find(id);
  if (it != segments_.end()) it->second.last_tick = ++tick_;
}

bool SegmentManager::AnyRecordDirty() const {
  for (const auto& [id, s] : segments_) {
    if (s.record_dirty) return true;
  }
  return false;
}

void SegmentManager::CollectRecords(const std::set<uint32_t>& with_data, uint64_t now_s,
                                    std::vector<std::pair<uint32_t, SegmentRecord>>* records,
                                    std::vector<std::shared_ptr<SegmentFile>>* to_sync) {
  for (auto& [id, s] : segments_) {
    if (!s.record_dirty && with_data.count(id) == 0) continue;
    if (with_data.count(id)) to_sync->push_back(s.file);
    SegmentRecord r;
    r.durable_bytes = s.write_offset;
    r.last_access_s = now_s;
    r.flags = s.sealed ? kSegmentSealed : 0;
    records->emplace_back(id, r);
    s.record_dirty = false;
  }
}

void SegmentManager::RaiseDurable(const std::vector<std::pair<uint32_t, SegmentRecord>>& records) {
  for (const auto& [id, r] : records) {
    auto it = segments_.find(id);
    if (it != segments_.end()) it->second.durable_bytes = std::max(it->second.durable_bytes, r.durable_bytes);
  }
}

}  // namespace shardcache::cache
