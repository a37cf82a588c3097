#include "daemon/cache/access_plan.h"

#include <algorithm>

namespace shardcache::cache {
namespace {
std::pair<uint64_t, uint64_t> VKey(const Hash128& v) { return {v.high, v.low}; }
}  // namespace

void AccessPlan::SetFutureAccessOrder(std::string_view version, uint64_t base_position,
                                      std::span<const ChunkRef> order) {
  const Hash128 vid = VersionId(version);
  VersionPlan plan;
  plan.uses.reserve(order.size());
  for (size_t i = 0; i < order.size(); ++i) {
    plan.uses.emplace_back(Fingerprint(ChunkKey{vid, order[i].shard, order[i].chunk}), base_position + i);
  }
  std::sort(plan.uses.begin(), plan.uses.end());
  WriterMutexLock lock(&mu_);
  if (order.empty()) {
    plans_.erase(VKey(vid));
    return;
  }
  auto it = plans_.find(VKey(vid));
  plan.now = base_position;
  if (it != plans_.end()) plan.now = std::max(plan.now, it->second.now);
  plans_[VKey(vid)] = std::move(plan);
}

void AccessPlan::Advance(std::string_view version, uint64_t position) {
  WriterMutexLock lock(&mu_);
  auto it = plans_.find(VKey(VersionId(version)));
  if (it != plans_.end()) it->second.now = std::max(it->second.now, position);
}

void AccessPlan::OnDemandRead(const ChunkKey& key) {
  const uint64_t fp = Fingerprint(key);
  {
    ReaderMutexLock lock(&mu_);
    auto it = plans_.find(VKey(key.version));
    if (it == plans_.end()) return;
    const uint64_t pos = NextPosition(it->second, fp, it->second.now);
    if (pos == kNever || pos - it->second.now > self_clock_window) return;
  }
  WriterMutexLock lock(&mu_);
  auto it = plans_.find(VKey(key.version));
  if (it == plans_.end()) return;
  const uint64_t pos = NextPosition(it->second, fp, it->second.now);
  if (pos == kNever || pos - it->second.now > self_clock_window) return;
  it->second.now = std::max(it->second.now, pos + 1);
}

void AccessPlan::Clear() {
  WriterMutexLock lock(&mu_);
  plans_.clear();
}

uint64_t AccessPlan::NextPosition(const VersionPlan& plan, uint64_t fp, uint64_t from) {
  auto it = std::lower_bound(plan.uses.begin(), plan.uses.end(), std::make_pair(fp, from));
  if (it == plan.uses.end() || it->first != fp) return kNever;
  return it->second;
}

uint64_t AccessPlan::NextUseDistance(uint64_t fingerprint) const {
  ReaderMutexLock lock(&mu_);
  uint64_t best = kNever;
  for (const auto& [vid, plan] : plans_) {
    const uint64_t pos = NextPosition(plan, fingerprint, plan.now);
    if (pos != kNever) best = std::min(best, pos - plan.now);
  }
  return best;
}

bool AccessPlan::empty() const {
  ReaderMutexLock lock(&mu_);
  return plans_.empty();
}

uint64_t AccessPlan::Now(std::string_view version) const {
  ReaderMutexLock lock(&mu_);
  auto it = plans_.find(VKey(VersionId(version)));
  return it == plans_.end() ? 0 : it->second.now;
}

}  // namespace shardcache::cache
