#include "daemon/serve/warm_jobs.h"

#include <string>
#include <vector>

#include "shardcache/local.pb.h"

namespace shardcache::serve {

Status WarmJobs::Start(const DatasetPtr& ds, v1::WarmDatasetResponse* r) {
  const std::string& dataset = ds->name;
  MutexLock l(&mu_);
  if (stopping_) return Unavailable("shardcached is shutting down; not warming '" + dataset + "'");
  std::vector<std::string> running;
  for (const auto& [id, job] : jobs_) {
    if (job->finished()) continue;
    if (job->dataset()->name == dataset) {
      r->set_warm_id(id);
      r->set_version(job->dataset()->version);
      r->set_total_bytes(job->total_bytes());
      r->set_total_chunks(job->total_chunks());
      r->set_already_running(true);
      return Status::Ok();
    }
    running.push_back("'" + job->dataset()->name + "'");
  }
  if (running.size() >= max_running_) {
    std::string names;
    for (const auto& n : running) names += (names.empty() ? "" : ", ") + n;
    return ResourceExhausted("cannot warm '" + dataset + "' now: " + std::to_string(running.size()) +
                             " warm jobs are running (" + names + "; limit " +
                             std::to_string(max_running_) + "); retry when one has finished");
  }
  // Forget the oldest finished jobs beyond kKept (ids grow with time).
  size_t finished = 0;
  for (const auto& [id, job] : jobs_) finished += job->finished();
  for (auto it = jobs_.begin(); it != jobs_.end() && finished >= kKept;) {
    if (it->second->finished()) {
      it = jobs_.erase(it);  // its threads have ended: the join is immediate
      --finished;
    } else {
      ++it;
    }
  }
  const uint64_t id = next_id_++;
  auto job = std::make_unique<WarmJob>(id, source_, ds, options_);
  r->set_warm_id(id);
  r->set_version(job->dataset()->version);
  r->set_total_bytes(job->total_bytes());
  r->set_total_chunks(job->total_chunks());
  r->set_already_running(false);
  jobs_[id] = std::move(job);
  return Status::Ok();
}

Status WarmJobs::Progress(uint64_t warm_id, v1::WarmStatusResponse* r) const {
  MutexLock l(&mu_);
  auto it = jobs_.find(warm_id);
  if (it == jobs_.end()) {
    return NotFound("no warm job " + std::to_string(warm_id) + " (the daemon keeps the last " +
                    std::to_string(kKept) + " finished ones, and none across restarts)");
  }
  const WarmJob& job = *it->second;
  const WarmProgress p = job.Progress();
  r->set_done_bytes(p.done_bytes);
  r->set_done_chunks(p.done_chunks);
  r->set_fetched_bytes(p.fetched_bytes);
  r->set_cached_bytes(p.cached_bytes);
  r->set_finished(p.finished);
  r->set_error_code(static_cast<uint32_t>(p.error.code()));
  r->set_error(p.error.message());
  r->set_elapsed_us(static_cast<uint64_t>(p.elapsed.count()));
  r->set_dataset(job.dataset()->name);
  r->set_version(job.dataset()->version);
  r->set_total_bytes(job.total_bytes());
  r->set_total_chunks(job.total_chunks());
  return Status::Ok();
}

void WarmJobs::StopAll() {
  std::map<uint64_t, std::unique_ptr<WarmJob>> jobs;
  {
    MutexLock l(&mu_);
    stopping_ = true;
    jobs.swap(jobs_);
  }
  // Cancel all, then join all: the jobs wind down in parallel.
  for (auto& [id, job] : jobs) job->Cancel("shardcached is shutting down");
  for (auto& [id, job] : jobs) job->Join();
}

void WarmJobs::Reopen() {
  MutexLock l(&mu_);
  stopping_ = false;
}

size_t WarmJobs::running() const {
  MutexLock l(&mu_);
  size_t n = 0;
  for (const auto& [id, job] : jobs_) n += !job->finished();
  return n;
}

}  // namespace shardcache::serve
