#include "daemon/serve/warm_job.h"

#include <algorithm>

#include <spdlog/spdlog.h>

#include "common/metrics.h"
#include "common/thread_name.h"
#include "common/units.h"

namespace shardcache::serve {

WarmJob::WarmJob(uint64_t id, ChunkSource& source, DatasetPtr dataset, WarmJobOptions options)
    : id_(id), source_(source), dataset_(std::move(dataset)), options_(options) {
  const auto& m = dataset_->manifest;
  const uint64_t per_range = std::max<uint32_t>(1, options_.range_chunks);
  for (uint32_t s = 0; s < static_cast<uint32_t>(m.shards_size()); ++s) {
    const uint64_t n = dataset::ChunkCount(m, s);
    total_chunks_ += n;
    for (uint64_t c = 0; c < n; c += per_range) ranges_.push_back({s, c, std::min(per_range, n - c)});
  }
  total_bytes_ = m.total_bytes();
  upstream_at_start_ = UpstreamCounter();
  const size_t workers = std::min<size_t>(std::max<uint32_t>(1, options_.parallel), ranges_.size());
  spdlog::info("warm {}: dataset '{}' version {}: {} in {} chunks, {} ranges, {} in parallel", id_,
               dataset_->name, dataset_->version, FormatBytes(total_bytes_), total_chunks_, ranges_.size(),
               workers);
  if (workers == 0) {  // an empty dataset is warm already
    MutexLock l(&mu_);
    finished_ = true;
    end_ = start_;
    return;
  }
  live_workers_.store(static_cast<int>(workers));
  MutexLock l(&join_mu_);
  for (size_t i = 0; i < workers; ++i) {
    workers_.emplace_back([this] {
      NameThisThread("sc-warm");
      Work();
    });
  }
}

WarmJob::~WarmJob() {
  Cancel("the warm job was destroyed");
  Join();
}

void WarmJob::Cancel(const std::string& why) {
  {
    MutexLock l(&mu_);
    if (finished_) return;
    if (error_.ok()) error_ = Cancelled("warming dataset '" + dataset_->name + "' was cancelled: " + why);
  }
  stop_.store(true);
}

void WarmJob::Join() {
  MutexLock l(&join_mu_);
  for (auto& t : workers_) {
    if (t.joinable()) t.join();
  }
}

bool WarmJob::finished() const {
  MutexLock l(&mu_);
  return finished_;
}

void WarmJob::Fail(const Status& s) {
  {
    MutexLock l(&mu_);
    if (error_.ok()) error_ = s;
  }
  stop_.store(true);
}

double WarmJob::UpstreamCounter() {
  return metrics::Registry::Global().ValueOf("shardcache_cache_served_bytes_total", {{"tier", "upstream"}});
}

uint64_t WarmJob::FetchedSinceStart(uint64_t done) const {
  const double now = UpstreamCounter();
  if (now < 0) return done;  // no cache tier in this process: every byte came from upstream
  const double delta = now - std::max(0.0, upstream_at_start_);
  return std::min<uint64_t>(done, delta > 0 ? static_cast<uint64_t>(delta) : 0);
}

void WarmJob::Work() {
  const auto& m = dataset_->manifest;
  while (!stop_.load()) {
    const size_t i = next_range_.fetch_add(1);
    if (i >= ranges_.size()) break;
    const Range& r = ranges_[i];
    ReadOptions ro;
    ro.priority = FetchPriority::kPrefetch;
    ro.deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(options_.range_timeout_ms);
    Status s = source_.ReadChunks(dataset_, r.shard, r.first, r.count, ro,
                                  [&](uint64_t, const ChunkPtr& c) -> Status {
                                    done_bytes_.fetch_add(c->bytes.size());
                                    done_chunks_.fetch_add(1);
                                    // Cancelled: the status Cancel() recorded is what is reported.
                                    return stop_.load() ? Cancelled("warm stopped") : Status::Ok();
                                  });
    if (!s.ok() && !stop_.load()) {
      Fail(s.WithContext("warming dataset '" + dataset_->name + "' (version " + dataset_->version + "): shard " +
                         std::to_string(r.shard) + " ('" + m.shards(static_cast<int>(r.shard)).path() +
                         "') chunks " + std::to_string(r.first) + ".." + std::to_string(r.first + r.count)));
    }
  }
  if (live_workers_.fetch_sub(1) != 1) return;
  // The last worker out records the outcome.
  const uint64_t done = done_bytes_.load();
  const uint64_t fetched = FetchedSinceStart(done);
  MutexLock l(&mu_);
  end_ = std::chrono::steady_clock::now();
  fetched_at_end_ = fetched;
  finished_ = true;
  const double secs = std::chrono::duration<double>(end_ - start_).count();
  if (error_.ok()) {
    spdlog::info("warm {}: dataset '{}' done: {} in {:.3f} s, {} from upstream", id_, dataset_->name,
                 FormatBytes(done), secs, FormatBytes(fetched));
  } else {
    spdlog::warn("warm {}: {} (after {} in {:.3f} s)", id_, error_.ToString(), FormatBytes(done), secs);
  }
}

WarmProgress WarmJob::Progress() const {
  WarmProgress p;
  MutexLock l(&mu_);
  p.done_bytes = done_bytes_.load();
  p.done_chunks = done_chunks_.load();
  p.finished = finished_;
  p.error = error_;
  const auto end = finished_ ? end_ : std::chrono::steady_clock::now();
  p.elapsed = std::chrono::duration_cast<std::chrono::microseconds>(end - start_);
  p.fetched_bytes = finished_ ? fetched_at_end_ : FetchedSinceStart(p.done_bytes);
  p.cached_bytes = p.done_bytes - p.fetched_bytes;
  return p;
}

}  // namespace shardcache::serve
