// Epoch plans: which samples each rank of a training job reads in one epoch, and in what order.
//
// A plan is a pure function of (dataset version, per-shard sample counts, seed, epoch, shuffle
// mode, world size, batch size, drop_last, block window). It does no I/O and depends on no clock,
// so every daemon and every rank computes the same plan whether the cache is cold or warm.
//
// Sample ids are global: shard 0's samples are 0..n0-1, shard 1's follow, and so on in manifest
// order.
//
// The global order is a sequence of all N sample ids (a permutation of 0..N-1). Rank r of W takes
// the positions p with p % W == r, in order (strided, like torch's DistributedSampler), so the
// ranks of one job walk the same region of the dataset at the same time and a node daemon that
// serves all of them fetches each chunk once.
//
//   drop_last = false: every sample appears exactly once across ranks. Rank r gets
//       ceil((N - r) / W) samples, so ranks differ by at most one; each rank's last batch holds
//       its remainder (it may be short). There is no padding and no duplicate.
//   drop_last = true:  K = floor(floor(N / W) / B) * B samples per rank, all batches full; the
//       global positions [K*W, N) are dropped — the same samples for every rank's view, and no
//       sample appears twice.
//
// Modes:
//   none   — the global order is 0..N-1 (nothing stored).
//   global — a full permutation: Fisher–Yates driven by splitmix64 seeded with
//            xxh3(version, seed, epoch) and Lemire's unbiased bounded draw — integer-only, so it
//            is the same on every platform and compiler.
//   block  — shuffle the shard order, then cut the shuffled shards into windows of
//            `block_window_shards` consecutive shards and shuffle the samples inside each window.
//            A cold epoch then reads only one window's shards at a time: near-sequential upstream
//            and no chunk evicted before all its samples were served. Default window (0 = auto):
//            the fewest shards whose average bytes cover kBlockChunksPerRank chunks per rank,
//            i.e. ceil(W * 4 * chunk_bytes / average shard bytes), at least 1.
//
// Resume: a rank that consumed c samples of an epoch continues at SampleAt(rank, c); the
// remaining order equals the uninterrupted one by construction.
//
// Cost: the order is stored as uint32 when N < 2^32 (4 bytes per sample), else uint64; `none`
// stores nothing. Measured on this machine: a global plan of 4M samples builds in ~70 ms, a
// block plan in ~50 ms (tests/plan, "plans for millions of samples are cheap").
//
// Thread safety: an EpochPlan is immutable after Make() and shared freely between loaders.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "dataset/manifest.h"

namespace shardcache::plan {

enum class ShuffleMode : uint8_t { kNone = 0, kGlobal = 1, kBlock = 2 };

// "none" | "global" | "block"; InvalidArgument naming the value otherwise.
Result<ShuffleMode> ParseShuffleMode(std::string_view name);
const char* ShuffleModeName(ShuffleMode mode);

// Chunks per rank that an auto-sized block window covers.
constexpr uint64_t kBlockChunksPerRank = 4;

// What the planner needs to know about a dataset.
struct DatasetLayout {
  std::string version;
  uint64_t chunk_bytes = dataset::kDefaultChunkBytes;
  std::vector<uint64_t> shard_samples;  // sample count per shard, manifest order
  std::vector<uint64_t> shard_bytes;    // size per shard, manifest order
};
DatasetLayout LayoutOf(const dataset::Dataset& d);

struct PlanOptions {
  uint64_t seed = 0;
  uint64_t epoch = 0;
  ShuffleMode mode = ShuffleMode::kNone;
  uint32_t world_size = 1;      // >= 1
  uint32_t batch_size = 1;      // >= 1; only drop_last uses it
  bool drop_last = false;
  uint32_t block_window_shards = 0;  // block mode only; 0 = auto (see above)
};

class EpochPlan {
 public:
  // InvalidArgument when world_size or batch_size is 0 or the layout is inconsistent.
  static Result<std::shared_ptr<const EpochPlan>> Make(const DatasetLayout& layout,
                                                       const PlanOptions& options);

  const PlanOptions& options() const { return options_; }
  uint64_t dataset_samples() const { return n_; }
  // Global positions in use: N, or K * world_size with drop_last.
  uint64_t used_positions() const { return used_; }
  uint64_t samples_per_rank(uint32_t rank) const;
  // Window size actually used in block mode (0 otherwise).
  uint32_t window_shards() const { return window_shards_; }

  // Global order position p → sample id. REQUIRES: p < used_positions().
  uint64_t AtPosition(uint64_t p) const {
    if (!order32_.empty()) return order32_[p];
    if (!order64_.empty()) return order64_[p];
    return p;
  }
  // The i-th sample of `rank`. REQUIRES: rank < world_size, i < samples_per_rank(rank).
  uint64_t SampleAt(uint32_t rank, uint64_t i) const {
    return AtPosition(i * options_.world_size + rank);
  }
  // Rank `rank`'s samples from index `from` (a resume point) to the end of the epoch.
  std::vector<uint64_t> RankOrder(uint32_t rank, uint64_t from = 0) const;

 private:
  EpochPlan() = default;

  PlanOptions options_;
  uint64_t n_ = 0;
  uint64_t used_ = 0;
  uint32_t window_shards_ = 0;
  std::vector<uint32_t> order32_;  // one of these holds the order unless mode == none
  std::vector<uint64_t> order64_;
};

// The 64-bit key every shuffle of (version, seed, epoch) starts from. Exposed for tests.
uint64_t PlanKey(std::string_view version, uint64_t seed, uint64_t epoch);

}  // namespace shardcache::plan
