#include "daemon/serve/loader_request.h"

#include "shardcache/local.pb.h"

namespace shardcache::serve {
namespace {

Status Bad(const std::string& field, uint64_t value, const std::string& rule) {
  return InvalidArgument("OpenLoader " + field + " " + std::to_string(value) + ": " + rule);
}

}  // namespace

Result<LoaderRequest> CheckOpenLoader(const v1::OpenLoaderRequest& o, uint32_t protocol_version) {
  if (o.batch_size() == 0 || o.batch_size() > kMaxBatchSize) {
    return Bad("batch_size", o.batch_size(), "must be 1 to " + std::to_string(kMaxBatchSize));
  }
  if (o.world_size() == 0 || o.world_size() > kMaxWorldSize) {
    return Bad("world_size", o.world_size(), "must be 1 to " + std::to_string(kMaxWorldSize));
  }
  if (o.rank() >= o.world_size()) return Bad("rank", o.rank(), "must be below world_size " + std::to_string(o.world_size()));
  // An enum field carries any int32 on the wire: compare the number, not the enum.
  const int shuffle = static_cast<int>(o.shuffle());
  if (shuffle < v1::SHUFFLE_NONE || shuffle > v1::SHUFFLE_BLOCK) {
    return InvalidArgument("OpenLoader shuffle " + std::to_string(shuffle) + ": must be 0 (none), 1 (global) or 2 (block)");
  }
  LoaderRequest r;
  r.dataset = o.dataset();
  r.ring = o.batch_ring();
  r.plan.seed = o.seed();
  r.plan.epoch = o.epoch();
  r.plan.mode = static_cast<plan::ShuffleMode>(shuffle);
  r.plan.world_size = o.world_size();
  r.plan.block_window_shards = o.block_window_shards();
  r.slice.rank = o.rank();
  r.slice.world_size = o.world_size();
  r.slice.batch_size = o.batch_size();
  r.slice.rank_start = o.samples_consumed();
  if (o.drop_last()) {
    r.slice.tail = plan::Tail::kDrop;
  } else {
    r.slice.tail = protocol_version < 5 || o.uneven() ? plan::Tail::kUneven : plan::Tail::kPad;
  }
  if (protocol_version >= 5) {
    const uint32_t workers = std::max(1u, o.num_workers());
    if (workers > kMaxLoaderWorkers) {
      return Bad("num_workers", o.num_workers(), "must be at most " + std::to_string(kMaxLoaderWorkers));
    }
    if (o.worker() >= workers) return Bad("worker", o.worker(), "must be below num_workers " + std::to_string(workers));
    r.slice.worker = o.worker();
    r.slice.num_workers = workers;
    r.slice.start_position = o.start_position();  // checked against the dataset by RankSlice::Make
    r.fields = o.fields();
    r.expect_version = o.expect_version();
  }
  return r;
}

}  // namespace shardcache::serve
