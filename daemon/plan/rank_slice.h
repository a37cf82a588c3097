// RankSlice: the samples one loader reads in one epoch, cut from the epoch's global order
// (epoch_plan.h) by rank, resume point and DataLoader worker.
//
// Ranks. Rank r of W takes the global positions p >= S (the segment start, see resume) with
// (p - S) % W == r, in order (strided, like torch's DistributedSampler), so the ranks of one
// job walk the same region of the dataset at the same time and a node daemon that serves all
// of them fetches each chunk once. With R = N - S positions left, what a rank gets depends on
// the tail mode:
//   pad    (drop_last = false, the default) — every rank gets ceil(R / W) samples, so every rank
//          runs the same number of batches (a DDP job whose ranks ran different counts hangs in
//          its last collective). A rank one short repeats the first sample of its own slice
//          (the rank's plan); a rank with no sample of its own (R < W) takes the segment's
//          first samples. At most W - 1 samples of an epoch are repeated, like DistributedSampler.
//   drop   (drop_last = true) — every rank gets K = floor(floor(R / W) / B) * B samples, all
//          batches full; positions [S + K*W, N) are dropped for every rank alike.
//   uneven (local protocol < 5, or asked for) — every sample exactly once; rank r gets
//          ceil((R - r) / W) samples, so ranks differ by one and a rank's last batch may be short.
//
// Resume. A job that stopped after every rank consumed c samples of a segment starting at S
// has consumed exactly the global positions [S, S + c*W): a prefix of the global order. It
// continues on any number of ranks W' with S' = S + c*W (`start_position`); with the same W a
// rank may also continue at its own `rank_start` = c inside the old segment, which is the same
// order (positions S + (c + j)*W + r).
//
// Workers. A rank's samples from rank_start on are cut into batches of B, b_0, b_1, ...; worker
// k of K takes b_k, b_{k+K}, b_{k+2K}, ... (the rank's last, short batch is the last one of
// whichever worker owns it). A DataLoader that takes one batch from each worker in turn
// (torch's in-order round robin) hands the trainer b_0, b_1, b_2, ... — exactly the order
// with no workers — and after t batches the rank has consumed rank_start + t*B samples
// (RankConsumedAfter), which is what a resume point records.
//
// Thread safety: immutable after Make(); copyable.
#pragma once

#include <cstdint>
#include <memory>
#include <string_view>

#include "common/status.h"
#include "daemon/plan/epoch_plan.h"

namespace shardcache::plan {

enum class Tail : uint8_t { kPad = 0, kDrop = 1, kUneven = 2 };
const char* TailName(Tail tail);

struct SliceOptions {
  uint32_t rank = 0;
  uint32_t world_size = 1;       // >= 1, rank < world_size
  uint32_t batch_size = 1;       // >= 1
  Tail tail = Tail::kPad;
  uint64_t start_position = 0;   // global positions before it are consumed; <= N
  uint64_t rank_start = 0;       // this rank's samples of the segment already consumed
  uint32_t worker = 0;           // < num_workers
  uint32_t num_workers = 1;      // >= 1
};

class RankSlice {
 public:
  // InvalidArgument naming the field for a zero world size, batch size or worker count, a rank
  // or worker beyond its count, or a start position past the dataset.
  static Result<RankSlice> Make(std::shared_ptr<const EpochPlan> plan, const SliceOptions& options);

  const SliceOptions& options() const { return options_; }
  const std::shared_ptr<const EpochPlan>& plan() const { return plan_; }
  // Samples this rank gets in the segment, before rank_start and workers are applied.
  uint64_t rank_samples() const { return rank_samples_; }
  // Samples this loader reads: its worker's batches from rank_start on.
  uint64_t size() const { return size_; }
  // The i-th sample this loader reads. REQUIRES: i < size().
  uint64_t SampleAt(uint64_t i) const { return AtRankIndex(RankIndexOf(i)); }
  // The rank's j-th sample of the segment (padding included). REQUIRES: j < rank_samples().
  uint64_t AtRankIndex(uint64_t j) const;
  // Rank index (as AtRankIndex takes it) of this loader's i-th sample.
  uint64_t RankIndexOf(uint64_t i) const;
  // The rank's consumed samples once the trainer has taken the loader's first `loader_samples`
  // samples and every batch the other workers deliver before them, i.e. the resume point after
  // the batch that ends at loader_samples (rank_start + that batch's rank end).
  uint64_t RankConsumedAfter(uint64_t loader_samples) const;
  // Global position (>= start_position) of the rank's j-th sample; padding maps to the sample
  // it repeats. REQUIRES: j < rank_samples().
  uint64_t PositionOf(uint64_t j) const;

 private:
  RankSlice() = default;

  std::shared_ptr<const EpochPlan> plan_;
  SliceOptions options_;
  uint64_t real_ = 0;          // the rank's own positions in the segment (no padding)
  uint64_t rank_samples_ = 0;  // with padding or drop
  uint64_t size_ = 0;
};

}  // namespace shardcache::plan
