#include "daemon/plan/rank_slice.h"

#include <algorithm>
#include <string>

namespace shardcache::plan {

const char* TailName(Tail tail) {
  switch (tail) {
    case Tail::kPad: return "pad";
    case Tail::kDrop: return "drop";
    case Tail::kUneven: return "uneven";
  }
  return "?";
}

Result<RankSlice> RankSlice::Make(std::shared_ptr<const EpochPlan> plan, const SliceOptions& o) {
  const uint64_t n = plan->dataset_samples();
  if (o.world_size == 0 || o.rank >= o.world_size) {
    return InvalidArgument("rank " + std::to_string(o.rank) + " is not below world_size " +
                           std::to_string(o.world_size));
  }
  if (o.batch_size == 0) return InvalidArgument("batch_size must be at least 1");
  if (o.num_workers == 0 || o.worker >= o.num_workers) {
    return InvalidArgument("worker " + std::to_string(o.worker) + " is not below num_workers " +
                           std::to_string(o.num_workers));
  }
  if (o.tail != Tail::kPad && o.tail != Tail::kDrop && o.tail != Tail::kUneven) {
    return InvalidArgument("unknown tail mode " + std::to_string(static_cast<int>(o.tail)));
  }
  if (o.start_position > n) {
    return InvalidArgument("start_position " + std::to_string(o.start_position) + " is past the " +
                           std::to_string(n) + " samples of the dataset");
  }
  RankSlice s;
  s.plan_ = std::move(plan);
  s.options_ = o;
  const uint64_t w = o.world_size, b = o.batch_size, k = o.worker, workers = o.num_workers;
  const uint64_t left = n - o.start_position;
  s.real_ = left > o.rank ? (left - o.rank + w - 1) / w : 0;
  switch (o.tail) {
    case Tail::kPad: s.rank_samples_ = (left + w - 1) / w; break;
    case Tail::kDrop: s.rank_samples_ = (left / w) / b * b; break;
    case Tail::kUneven: s.rank_samples_ = s.real_; break;
  }
  const uint64_t remaining = s.rank_samples_ > o.rank_start ? s.rank_samples_ - o.rank_start : 0;
  const uint64_t batches = (remaining + b - 1) / b;
  const uint64_t mine = batches > k ? (batches - k - 1) / workers + 1 : 0;
  const bool owns_last = batches > 0 && (batches - 1) % workers == k;
  const uint64_t last_len = remaining - (batches > 0 ? (batches - 1) * b : 0);
  s.size_ = mine == 0 ? 0 : owns_last ? (mine - 1) * b + last_len : mine * b;
  return s;
}

uint64_t RankSlice::RankIndexOf(uint64_t i) const {
  const uint64_t b = options_.batch_size;
  const uint64_t batch = (i / b) * options_.num_workers + options_.worker;
  return options_.rank_start + batch * b + i % b;
}

uint64_t RankSlice::RankConsumedAfter(uint64_t loader_samples) const {
  if (loader_samples == 0) return std::min(options_.rank_start, rank_samples_);
  const uint64_t b = options_.batch_size;
  const uint64_t batch = ((loader_samples - 1) / b) * options_.num_workers + options_.worker;
  return std::min(options_.rank_start + (batch + 1) * b, rank_samples_);
}

uint64_t RankSlice::PositionOf(uint64_t j) const {
  const uint64_t s = options_.start_position, w = options_.world_size, r = options_.rank;
  if (j < real_) return s + j * w + r;
  if (real_ > 0) return s + ((j - real_) % real_) * w + r;  // repeat the start of the rank's own slice
  const uint64_t left = plan_->dataset_samples() - s;         // > 0: rank_samples_ > 0 here
  return s + (j * w + r) % left;
}

uint64_t RankSlice::AtRankIndex(uint64_t j) const { return plan_->AtPosition(PositionOf(j)); }

}  // namespace shardcache::plan
