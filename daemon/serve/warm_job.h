// WarmJob: a daemon-side job that reads every chunk of one dataset version through the node's
// ChunkSource (the cache tiers), so that the node's cache holds the whole dataset afterwards —
// what `shardctl warm --socket` asks a running daemon to do (WarmDataset in local.proto).
//
// The job walks every shard in ranges of `range_chunks` chunks, `parallel` ranges at a time,
// with ReadOptions.priority = kPrefetch (demand reads of trainers go first upstream) and a sink
// that only counts the chunk: the cache tier stores what it fetches. The reads go through the
// cache's single-flight, so a chunk a trainer is fetching at the same time is fetched once.
// The first failing range stops the job; its error names the dataset, the shard (index and
// file) and the chunk range, with the source's status.
//
// Fetched vs cached: ChunkSource does not say where a chunk came from, so the split is measured
// from the cache's node-wide upstream counter (shardcache_cache_served_bytes_total{tier=
// "upstream"}, which counts flight leaders only) between the job's start and now/its end,
// capped at the job's bytes. Exact when nothing else reads cold data meanwhile; trainers'
// fetches in that window count as fetched. Without a cache tier (the counter does not exist)
// every byte is fetched.
//
// Lifetime: the threads start in the constructor. Cancel() makes every worker stop after the
// chunk it is receiving (a read waiting on the upstream ends at the latest at its deadline,
// range_timeout_ms); the destructor cancels and joins. The job does not depend on any client
// connection.
//
// Thread safety: all public methods are safe from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "common/mutex.h"
#include "common/status.h"
#include "daemon/source/chunk_source.h"

namespace shardcache::serve {

struct WarmJobOptions {
  // Chunks per ReadChunks call. Default: 64 (256 MiB at the default 4 MiB chunk).
  uint32_t range_chunks = 64;
  // Ranges read at the same time. Default: 4.
  uint32_t parallel = 4;
  // Deadline of one range read. Also bounds how long Cancel() can wait on a stalled upstream.
  // Default: 300 s.
  uint32_t range_timeout_ms = 300000;
};

struct WarmProgress {
  uint64_t done_bytes = 0;
  uint64_t done_chunks = 0;
  uint64_t fetched_bytes = 0;  // see "Fetched vs cached" above
  uint64_t cached_bytes = 0;
  bool finished = false;
  Status error;                // non-OK once failed or cancelled
  std::chrono::microseconds elapsed{0};
};

class WarmJob {
 public:
  // Starts warming `dataset` (a manifest from source.OpenDataset) at once.
  WarmJob(uint64_t id, ChunkSource& source, DatasetPtr dataset, WarmJobOptions options = {});
  ~WarmJob();  // Cancel() and join
  WarmJob(const WarmJob&) = delete;
  WarmJob& operator=(const WarmJob&) = delete;

  // Stops the job; its error becomes Cancelled naming the dataset and `why`. No effect once
  // finished.
  void Cancel(const std::string& why);
  // Blocks until every worker has ended (finished() is true afterwards).
  void Join();

  WarmProgress Progress() const;
  bool finished() const;

  uint64_t id() const { return id_; }
  const DatasetPtr& dataset() const { return dataset_; }
  uint64_t total_bytes() const { return total_bytes_; }
  uint64_t total_chunks() const { return total_chunks_; }

 private:
  struct Range {
    uint32_t shard;
    uint64_t first, count;
  };
  void Work();
  void Fail(const Status& s);
  // Node-wide bytes the cache served after an upstream fetch; -1 when there is no cache tier.
  static double UpstreamCounter();
  uint64_t FetchedSinceStart(uint64_t done) const;

  // Constant after construction.
  const uint64_t id_;
  ChunkSource& source_;
  const DatasetPtr dataset_;
  const WarmJobOptions options_;
  std::vector<Range> ranges_;
  uint64_t total_bytes_ = 0;
  uint64_t total_chunks_ = 0;
  const std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  double upstream_at_start_ = -1;

  std::atomic<size_t> next_range_{0};
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> done_bytes_{0}, done_chunks_{0};
  std::atomic<int> live_workers_{0};

  mutable Mutex mu_;
  Status error_ GUARDED_BY(mu_);           // first failure
  bool finished_ GUARDED_BY(mu_) = false;  // set by the last worker
  std::chrono::steady_clock::time_point end_ GUARDED_BY(mu_){};
  uint64_t fetched_at_end_ GUARDED_BY(mu_) = 0;

  Mutex join_mu_;                                          // serializes Join()
  std::vector<std::thread> workers_ GUARDED_BY(join_mu_);  // after construction
};

}  // namespace shardcache::serve
