#include "daemon/plan/epoch_plan.h"

#include <algorithm>
#include <limits>
#include <numeric>

#include "common/hash.h"
#include "common/random.h"

namespace shardcache::plan {
namespace {

// Distinct streams for the parts of one plan, so changing the window size does not change the
// shard order.
constexpr uint64_t kGlobalStream = 0x676c6f62616c0001ull;
constexpr uint64_t kShardStream = 0x736861726473ull;
constexpr uint64_t kWindowStream = 0x77696e646f77ull;

template <typename T>
void Build(const DatasetLayout& layout, const PlanOptions& o, uint64_t n, uint32_t window,
           std::vector<T>* order) {
  const uint64_t key = PlanKey(layout.version, o.seed, o.epoch);
  order->resize(n);
  if (o.mode == ShuffleMode::kGlobal) {
    std::iota(order->begin(), order->end(), T{0});
    SplitMix64 rng(key ^ kGlobalStream);
    Shuffle(order->data(), n, rng);
    return;
  }
  // Block: shard order first, then samples inside each window of `window` shards.
  const size_t shards = layout.shard_samples.size();
  std::vector<uint64_t> first_id(shards, 0);
  for (size_t s = 1; s < shards; ++s) first_id[s] = first_id[s - 1] + layout.shard_samples[s - 1];
  std::vector<uint32_t> shard_order(shards);
  std::iota(shard_order.begin(), shard_order.end(), 0u);
  SplitMix64 shard_rng(key ^ kShardStream);
  Shuffle(shard_order.data(), shards, shard_rng);
  SplitMix64 window_rng(key ^ kWindowStream);
  uint64_t pos = 0;
  for (size_t w = 0; w < shards; w += window) {
    const uint64_t window_start = pos;
    for (size_t k = w; k < std::min<size_t>(shards, w + window); ++k) {
      const uint32_t s = shard_order[k];
      for (uint64_t i = 0; i < layout.shard_samples[s]; ++i) (*order)[pos++] = static_cast<T>(first_id[s] + i);
    }
    Shuffle(order->data() + window_start, pos - window_start, window_rng);
  }
}

}  // namespace

Result<ShuffleMode> ParseShuffleMode(std::string_view name) {
  if (name == "none") return ShuffleMode::kNone;
  if (name == "global") return ShuffleMode::kGlobal;
  if (name == "block") return ShuffleMode::kBlock;
  return InvalidArgument("shuffle mode '" + std::string(name) + "' is not one of none|global|block");
}

const char* ShuffleModeName(ShuffleMode mode) {
  switch (mode) {
    case ShuffleMode::kNone: return "none";
    case ShuffleMode::kGlobal: return "global";
    case ShuffleMode::kBlock: return "block";
  }
  return "?";
}

DatasetLayout LayoutOf(const dataset::Dataset& d) {
  DatasetLayout l;
  l.version = d.version;
  l.chunk_bytes = d.manifest.chunk_bytes();
  for (const auto& s : d.manifest.shards()) {
    l.shard_samples.push_back(s.sample_count());
    l.shard_bytes.push_back(s.size_bytes());
  }
  return l;
}

uint64_t PlanKey(std::string_view version, uint64_t seed, uint64_t epoch) {
  std::string buf(version);
  for (uint64_t v : {seed, epoch}) {
    for (int b = 0; b < 8; ++b) buf.push_back(static_cast<char>((v >> (8 * b)) & 0xff));
  }
  return HashBytes(buf).low;
}

uint32_t ResolveBlockWindow(const DatasetLayout& layout, const PlanOptions& options) {
  if (options.mode != ShuffleMode::kBlock) return 0;
  const uint64_t shards = layout.shard_samples.size();
  if (options.block_window_shards != 0 || shards == 0) return std::max<uint32_t>(options.block_window_shards, 1);
  const uint64_t total_bytes = std::accumulate(layout.shard_bytes.begin(), layout.shard_bytes.end(), uint64_t{0});
  const uint64_t avg = std::max<uint64_t>(1, total_bytes / shards);
  const uint64_t target = uint64_t{std::max<uint32_t>(options.world_size, 1)} * kBlockChunksPerRank *
                          std::max<uint64_t>(1, layout.chunk_bytes);
  return static_cast<uint32_t>(std::clamp<uint64_t>((target + avg - 1) / avg, 1, shards));
}

Result<std::shared_ptr<const EpochPlan>> EpochPlan::Make(const DatasetLayout& layout,
                                                         const PlanOptions& options) {
  if (options.world_size == 0) return InvalidArgument("world_size must be at least 1");
  if (options.mode != ShuffleMode::kNone && options.mode != ShuffleMode::kGlobal &&
      options.mode != ShuffleMode::kBlock) {
    return InvalidArgument("unknown shuffle mode " + std::to_string(static_cast<int>(options.mode)));
  }
  if (!layout.shard_bytes.empty() && layout.shard_bytes.size() != layout.shard_samples.size()) {
    return InvalidArgument("dataset layout has " + std::to_string(layout.shard_samples.size()) +
                           " sample counts but " + std::to_string(layout.shard_bytes.size()) +
                           " shard sizes");
  }
  std::shared_ptr<EpochPlan> p(new EpochPlan());
  p->options_ = options;
  p->n_ = std::accumulate(layout.shard_samples.begin(), layout.shard_samples.end(), uint64_t{0});
  p->window_shards_ = ResolveBlockWindow(layout, options);
  p->options_.block_window_shards = p->window_shards_;
  if (options.mode != ShuffleMode::kNone && p->n_ > 0) {
    if (p->n_ <= std::numeric_limits<uint32_t>::max()) {
      Build(layout, options, p->n_, p->window_shards_, &p->order32_);
    } else {
      Build(layout, options, p->n_, p->window_shards_, &p->order64_);
    }
  }
  return std::shared_ptr<const EpochPlan>(std::move(p));
}

}  // namespace shardcache::plan
