#include "daemon/serve/sample_warmer.h"

#include <algorithm>
#include <map>

namespace shardcache::serve {

SampleWarmer::SampleWarmer(BatchAssembler& assembler, SampleLocator& locator, const plan::RankSlice& slice,
                           std::shared_ptr<const std::atomic<uint64_t>> assembled_from)
    : assembler_(assembler), locator_(locator), slice_(slice), assembled_from_(std::move(assembled_from)) {}

bool SampleWarmer::Warm(uint64_t base, uint64_t lookahead) {
  // Samples before `base` are in batches being assembled: their own reads fetch them.
  next_ = std::max(next_, base);
  // Jobs the pool had no room for go first, in order; new ones only once they are all out.
  bool progress = SendUnsent();
  if (!unsent_.empty()) return progress;
  Walk(lookahead);
  return SendUnsent() || progress;
}

bool SampleWarmer::SendUnsent() {
  bool sent = false;
  while (!unsent_.empty() && Send(unsent_.front())) {
    unsent_bytes_ -= unsent_.front().bytes;
    unsent_.pop_front();
    sent = true;
  }
  return sent;
}

void SampleWarmer::Walk(uint64_t lookahead) {
  // A pass waits until it can walk a sixteenth of the lookahead: each pass's samples become a
  // read per shard, and passes of a few samples each would make many small reads (each holds a
  // reader thread until its last range lands) that cannot keep enough bytes in flight.
  if (in_flight_bytes() + unsent_bytes_ + lookahead / kPassFraction > lookahead && in_flight_bytes() > 0) return;
  const auto& m = locator_.dataset()->manifest;
  const uint64_t cb = m.chunk_bytes();
  std::map<uint32_t, Job> open;  // this pass's job of each shard
  std::vector<Job> done;
  const uint64_t stop = std::min(slice_.size(), next_ + kMaxWalk);
  while (next_ < stop && in_flight_bytes() + unsent_bytes_ < lookahead) {
    auto e = locator_.Locate(slice_.SampleAt(next_));
    if (!e.ok()) break;  // the demand path reports it
    Job& job = open[e->shard];
    if (job.pieces.empty()) {
      job.shard = e->shard;
      job.first_index = next_;
    }
    // One piece per chunk the sample overlaps.
    for (uint64_t at = e->offset, end = e->offset + e->length; at < end;) {
      const uint64_t c = at / cb;
      const uint64_t take = std::min(end, (c + 1) * cb) - at;
      job.pieces.push_back(ChunkPiece{c, at - c * cb, take, nullptr});
      at += take;
    }
    job.bytes += e->length;
    job.last_index = next_;
    unsent_bytes_ += e->length;
    ++next_;
    if (job.bytes >= kMaxJobBytes) {
      done.push_back(std::move(job));
      open.erase(e->shard);
    }
  }
  for (auto& [shard, job] : open) done.push_back(std::move(job));
  std::sort(done.begin(), done.end(), [](const Job& a, const Job& b) { return a.first_index < b.first_index; });
  for (Job& job : done) unsent_.push_back(std::move(job));
}

bool SampleWarmer::Send(Job& job) {
  in_flight_->fetch_add(job.bytes, std::memory_order_relaxed);
  const bool taken = assembler_.TryWarmPieces(
      locator_.dataset(), job.shard, job.pieces,
      // A read still waiting in the pool once assembly passed all its samples is dropped: the
      // batches read them already.
      [from = assembled_from_, last = job.last_index] { return from->load() <= last; },
      [in_flight = in_flight_](uint64_t bytes) { in_flight->fetch_sub(bytes, std::memory_order_relaxed); });
  if (!taken) in_flight_->fetch_sub(job.bytes, std::memory_order_relaxed);
  return taken;
}

}  // namespace shardcache::serve
