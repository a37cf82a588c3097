// LoaderRequest: an OpenLoaderRequest (local.proto) checked field by field, in one place, before
// anything is built from it. A trainer is not trusted: a hostile or buggy request gets a clear
// InvalidArgument naming the field and its value, never a plan that cannot end (a shuffle of -1
// once passed an upper-bound check and looped forever) or a resource the daemon cannot afford.
//
// Thread safety: pure function.
#pragma once

#include <cstdint>
#include <string>

#include "common/status.h"
#include "daemon/plan/epoch_plan.h"
#include "daemon/plan/rank_slice.h"

namespace shardcache::v1 {
class OpenLoaderRequest;
}

namespace shardcache::serve {

// Caps on what one request may ask for. Batches beyond kMaxBatchSize samples would not fit a
// batch ring (batch_ring::kMaxRingBytes) anyway; a DataLoader with more workers than this is not
// a DataLoader.
constexpr uint32_t kMaxBatchSize = 1u << 20;
constexpr uint32_t kMaxWorldSize = 1u << 20;
constexpr uint32_t kMaxLoaderWorkers = 1024;

struct LoaderRequest {
  std::string dataset;
  plan::PlanOptions plan;    // seed, epoch, mode, window, world size
  plan::SliceOptions slice;  // rank, batch, tail, resume point, worker
  bool ring = false;
  bool fields = false;
  std::string expect_version;  // "" = any
};

// `protocol_version` is the one the client's Hello named: before 5, drop_last = false splits
// unevenly and the version-5 fields are ignored.
Result<LoaderRequest> CheckOpenLoader(const v1::OpenLoaderRequest& request, uint32_t protocol_version);

}  // namespace shardcache::serve
