// ChunkLeaders: the single-flight leaders of one fetch's chunks [first, end), shared by the
// fetch and its hedge (grpc_source.h): whichever verifies a chunk first publishes it, a later
// copy is dropped, and either one can see what is left to fetch.
//
// Thread safety: all methods are thread-safe.
#pragma once

#include <cstdint>
#include <vector>

#include "common/mutex.h"
#include "daemon/source/chunk_key.h"
#include "daemon/source/chunk_source.h"
#include "daemon/upstream/single_flight.h"

namespace shardcache::upstream {

class ChunkLeaders {
 public:
  using Flights = SingleFlight<ChunkKey, Result<ChunkPtr>, ChunkKeyHash>;

  // Adds the leader of chunk `c` (chunks are added in order, without gaps).
  void Add(uint64_t c, Flights::Flight f) {
    MutexLock l(&mu_);
    if (flights_.empty()) first_ = c;
    flights_.push_back(std::move(f));
  }
  // Hands `r` to chunk c's waiters unless a copy was published already.
  void Publish(uint64_t c, Result<ChunkPtr> r) {
    MutexLock l(&mu_);
    if (Has(c)) flights_[c - first_].Publish(std::move(r));
  }
  // The first chunk in [c, end) not yet published; `end` when all are (or were dropped).
  uint64_t NextOpen(uint64_t c, uint64_t end) {
    MutexLock l(&mu_);
    while (c < end && Has(c) && !flights_[c - first_].leader()) ++c;
    return Has(c) ? c : end;
  }
  // True when a chunk not yet published is wanted now by a caller (SingleFlight::MarkWanted).
  bool AnyOpenWanted() {
    MutexLock l(&mu_);
    for (const Flights::Flight& f : flights_) {
      if (f.leader() && f.wanted()) return true;
    }
    return false;
  }
  // Publishes Aborted to the chunks left (their waiters refetch).
  void Drop() {
    MutexLock l(&mu_);
    flights_.clear();
  }

 private:
  bool Has(uint64_t c) const REQUIRES(mu_) { return c >= first_ && c - first_ < flights_.size(); }

  Mutex mu_;
  uint64_t first_ GUARDED_BY(mu_) = 0;
  std::vector<Flights::Flight> flights_ GUARDED_BY(mu_);
};

}  // namespace shardcache::upstream
