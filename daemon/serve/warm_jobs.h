// WarmJobs: the local service's registry of warm jobs (WarmDataset / WarmStatus, local
// protocol 2; one job is a WarmJob, warm_job.h).
//
// A job belongs to the registry, not to the connection that asked for it: a client that
// disconnects leaves it running. One job per dataset name runs at a time (a second request
// gets the running job's id), at most max_running run at once (a request beyond gets
// ResourceExhausted naming the running ones), and the outcome of the last kKept finished jobs
// can still be polled. StopAll() cancels every job, joins them and refuses new ones.
//
// Thread safety: all public methods are safe from any thread.
#pragma once

#include <cstdint>
#include <map>
#include <memory>

#include "common/mutex.h"
#include "common/status.h"
#include "daemon/serve/warm_job.h"
#include "daemon/source/chunk_source.h"

namespace shardcache::v1 {
class WarmDatasetResponse;
class WarmStatusResponse;
}  // namespace shardcache::v1

namespace shardcache::serve {

class WarmJobs {
 public:
  // Finished jobs whose outcome stays available to Status.
  static constexpr size_t kKept = 16;

  WarmJobs(ChunkSource& source, uint32_t max_running, WarmJobOptions options)
      : source_(source), max_running_(max_running), options_(options) {}
  ~WarmJobs() { StopAll(); }
  WarmJobs(const WarmJobs&) = delete;
  WarmJobs& operator=(const WarmJobs&) = delete;

  // The running job for the dataset, or a new one.
  Status Start(const DatasetPtr& dataset, v1::WarmDatasetResponse* response);
  // NotFound for an id never given or forgotten.
  Status Progress(uint64_t warm_id, v1::WarmStatusResponse* response) const;
  void StopAll();
  // Accepts new jobs again after StopAll (a service started again).
  void Reopen();
  size_t running() const;

 private:
  ChunkSource& source_;
  const uint32_t max_running_;
  const WarmJobOptions options_;
  // By id: the running jobs and the last kKept finished ones.
  mutable Mutex mu_;
  std::map<uint64_t, std::unique_ptr<WarmJob>> jobs_ GUARDED_BY(mu_);
  uint64_t next_id_ GUARDED_BY(mu_) = 1;
  bool stopping_ GUARDED_BY(mu_) = false;
};

}  // namespace shardcache::serve
