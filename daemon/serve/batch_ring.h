// BatchRing: the daemon's side of one loader's batch ring (layout: common/batch_ring.h).
//
// A sealed memfd of RingBytes(entries, max_samples), mapped read-write here and handed to the
// client, which maps it read-only. Publish() writes the next entry and then advances
// `published`; the daemon keeps its own count and never reads the shared memory back.
//
// Thread safety: Publish() calls must be serialized by the caller (LoaderPipeline holds its
// mutex); fd() and the sizes are immutable.
#pragma once

#include <cstdint>
#include <memory>

#include "common/batch_ring.h"
#include "common/fs.h"
#include "common/status.h"
#include "daemon/serve/batch_assembler.h"

namespace shardcache::serve {

class BatchRing {
 public:
  // InvalidArgument when entries or max_samples is 0 or the ring would exceed
  // batch_ring::kMaxRingBytes; ResourceExhausted / Internal when memfd, sealing or mmap fail.
  static Result<std::unique_ptr<BatchRing>> Create(uint32_t entries, uint32_t max_samples);
  ~BatchRing();
  BatchRing(const BatchRing&) = delete;
  BatchRing& operator=(const BatchRing&) = delete;

  int fd() const { return fd_.get(); }
  uint64_t bytes() const { return bytes_; }
  uint32_t entries() const { return entries_; }
  uint32_t max_samples() const { return max_samples_; }
  uint64_t published() const { return published_; }

  // Describes `batch` (in arena slot `slot`; the rank's resume point after it is
  // `rank_consumed`) as entry published() and publishes it.
  // REQUIRES: batch.sample_ids.size() <= max_samples(), and the batch of entry
  // published() - entries() was released (its place is reused).
  void Publish(uint32_t slot, uint64_t batch_seq, uint64_t rank_consumed, const AssembledBatch& batch);

 private:
  BatchRing() = default;

  UniqueFd fd_;
  uint8_t* base_ = nullptr;
  uint64_t bytes_ = 0;
  uint32_t entries_ = 0;
  uint32_t max_samples_ = 0;
  uint64_t stride_ = 0;
  uint64_t published_ = 0;
};

}  // namespace shardcache::serve
