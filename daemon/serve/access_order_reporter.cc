#include "daemon/serve/access_order_reporter.h"

#include <algorithm>

#include "common/thread_name.h"
#include "daemon/serve/loader_factory.h"

namespace shardcache::serve {

void AccessOrderReporter::Start() {
  if (!options_.observer || thread_.joinable()) return;
  {
    MutexLock l(&mu_);
    stop_ = false;
  }
  thread_ = std::thread([this] {
    NameThisThread("sc-order-report");
    Loop();
  });
}

void AccessOrderReporter::Stop() {
  if (!thread_.joinable()) return;
  {
    MutexLock l(&mu_);
    stop_ = true;
  }
  cv_.NotifyAll();
  thread_.join();
}

void AccessOrderReporter::NoteLoader(const DatasetPtr& dataset, const std::shared_ptr<SampleLocator>& locator,
                                     const plan::RankSlice& slice) {
  if (!options_.observer) return;
  const plan::SliceOptions& so = slice.options();
  const std::string key = PlanKey(dataset, slice.plan()->options()) + "/" + std::to_string(so.world_size) + "/" +
                          std::to_string(so.start_position);
  {
    MutexLock l(&mu_);
    PlanUse& u = uses_[key];
    u.dataset = dataset;
    u.locator = locator;
    u.plan = slice.plan();
    u.world_size = so.world_size;
    u.start_position = so.start_position;
    auto [it, inserted] = u.rank_start.emplace(so.rank, so.rank_start);
    if (!inserted && so.rank_start >= it->second) return;  // nothing new to report
    it->second = std::min(it->second, so.rank_start);
    u.dirty = true;
  }
  cv_.NotifyAll();
}

std::vector<AccessOrderReporter::PlanUse> AccessOrderReporter::NextReports() {
  cv_.Wait(&mu_, [&]() REQUIRES(mu_) {
    if (stop_) return true;
    for (auto& [k, u] : uses_) if (u.dirty) return true;
    return false;
  });
  if (stop_) return {};
  // Let the other ranks of the job open before computing.
  cv_.WaitFor(&mu_, std::chrono::milliseconds(options_.delay_ms), [&]() REQUIRES(mu_) { return stop_; });
  if (stop_) return {};
  std::vector<PlanUse> todo;
  for (auto it = uses_.begin(); it != uses_.end();) {
    if (it->second.plan.expired()) {
      it = uses_.erase(it);
      continue;
    }
    if (it->second.dirty) {
      it->second.dirty = false;
      todo.push_back(it->second);
    }
    ++it;
  }
  return todo;
}

void AccessOrderReporter::Loop() {
  MutexLock l(&mu_);
  while (!stop_) {
    const std::vector<PlanUse> todo = NextReports();
    l.Unlock();
    for (const PlanUse& u : todo) {
      auto plan = u.plan.lock();
      auto locator = u.locator.lock();
      if (!plan || !locator) continue;
      options_.observer(u.dataset, FutureOrder(u, *plan, *locator));
    }
    l.Lock();
  }
}

std::vector<ChunkAccess> AccessOrderReporter::FutureOrder(const PlanUse& u, const plan::EpochPlan& plan,
                                                          SampleLocator& locator) {
  const uint64_t w = u.world_size, first = u.start_position;
  uint64_t from = UINT64_MAX;
  for (auto& [rank, start] : u.rank_start) from = std::min(from, first + start * w);
  std::vector<ChunkAccess> order;
  const uint64_t cb = u.dataset->manifest.chunk_bytes();
  auto add = [&](uint64_t id) {
    auto e = locator.Locate(id);
    if (!e.ok() || e->length == 0) return;
    for (uint64_t c = e->offset / cb; c <= (e->offset + e->length - 1) / cb; ++c) {
      if (!order.empty() && order.back().shard == e->shard && order.back().chunk == c) continue;
      order.push_back({e->shard, c});
    }
  };
  // Padding and a dropped tail are a few samples either way: the global order decides.
  for (uint64_t p = from; p < plan.dataset_samples(); ++p) {
    if (u.rank_start.count(static_cast<uint32_t>((p - first) % w))) add(plan.AtPosition(p));
  }
  auto next_opts = plan.options();
  next_opts.epoch += 1;
  if (auto next = plan::EpochPlan::Make(plan::LayoutOf(*u.dataset), next_opts); next.ok()) {
    for (uint64_t p = 0; p < (*next)->dataset_samples(); ++p) {
      if (u.rank_start.count(static_cast<uint32_t>(p % w))) add((*next)->AtPosition(p));
    }
  }
  return order;
}

}  // namespace shardcache::serve
