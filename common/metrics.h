// Process-wide metrics, rendered in the Prometheus text format. A figure reaches it one of two
// ways, never both for one event:
//   - a component that keeps per-instance figures (its Stats()) owns them and adds itself as a
//     stats::Source (common/stats.h): the registry visits it at every render;
//   - a figure no component keeps (a process-wide event, a histogram) is a Counter, Gauge or
//     Histogram registered here once and updated on hot paths with relaxed atomics.
// Either way a family is registered through this class, with its name, HELP and kind.
//
// Thread safety: registration takes the registry's mutex; updates are lock-free (counters and
// gauges) or take only the histogram's atomics. Metric objects live as long as the registry
// (the process, for Global()), so components keep plain pointers to them. Lock order:
// sources_mu_ (held while visiting sources, so a source cannot leave mid-render) → a source's
// own locks → mu_.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/mutex.h"
#include "common/stats.h"

namespace shardcache::metrics {

using Labels = stats::Labels;

class Registry;

// Keeps a stats::Source in its registry's renderings while it lives (Registry::AddSource).
class SourceHandle {
 public:
  SourceHandle() = default;
  SourceHandle(Registry* registry, const stats::Source* source) : registry_(registry), source_(source) {}
  SourceHandle(SourceHandle&& o) noexcept { *this = std::move(o); }
  SourceHandle& operator=(SourceHandle&& o) noexcept;
  SourceHandle(const SourceHandle&) = delete;
  SourceHandle& operator=(const SourceHandle&) = delete;
  ~SourceHandle() { Reset(); }
  void Reset();  // removes the source now

 private:
  Registry* registry_ = nullptr;
  const stats::Source* source_ = nullptr;
};

class Counter {
 public:
  void Add(uint64_t n = 1) { v_.fetch_add(n, std::memory_order_relaxed); }
  // Raises the counter to `total` and never lowers it: for counts kept elsewhere (the kernel's
  // CPU time of this process), exported as they are.
  void Advance(uint64_t total) {
    uint64_t cur = v_.load(std::memory_order_relaxed);
    while (cur < total && !v_.compare_exchange_weak(cur, total, std::memory_order_relaxed)) {}
  }
  uint64_t Value() const { return v_.load(std::memory_order_relaxed); }

 private:
  std::atomic<uint64_t> v_{0};
};

class Gauge {
 public:
  void Set(double v) { v_.store(v, std::memory_order_relaxed); }
  void Add(double d) {
    double cur = v_.load(std::memory_order_relaxed);
    while (!v_.compare_exchange_weak(cur, cur + d, std::memory_order_relaxed)) {}
  }
  double Value() const { return v_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> v_{0};
};

// Cumulative histogram with fixed upper bounds (seconds, bytes, ...).
class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void Observe(double v);
  const std::vector<double>& bounds() const { return bounds_; }
  // Per-bucket counts (not cumulative); last entry is +Inf.
  std::vector<uint64_t> BucketCounts() const;
  uint64_t Count() const { return count_.load(std::memory_order_relaxed); }
  double Sum() const { return sum_.load(std::memory_order_relaxed); }
  // Approximate quantile q in [0,1] by linear interpolation inside the bucket.
  double Quantile(double q) const;

 private:
  std::vector<double> bounds_;
  std::unique_ptr<std::atomic<uint64_t>[]> buckets_;
  std::atomic<uint64_t> count_{0};
  std::atomic<double> sum_{0};
};

// Exponential latency buckets from 10 µs to ~10 s, in seconds.
std::vector<double> LatencyBuckets();

class Registry {
 public:
  // Each returns the existing metric when name+labels were registered before.
  Counter* GetCounter(const std::string& name, const std::string& help, const Labels& labels = {});
  // A counter kept in integer multiples of `unit` (1e-6: microseconds) and exposed in the base
  // unit its name carries (`_seconds_total`), so hot paths add integers while the exposition
  // follows Prometheus naming. Every series of one family has the same unit.
  Counter* GetScaledCounter(const std::string& name, const std::string& help, double unit,
                            const Labels& labels = {});
  Gauge* GetGauge(const std::string& name, const std::string& help, const Labels& labels = {});
  Histogram* GetHistogram(const std::string& name, const std::string& help,
                          std::vector<double> bounds, const Labels& labels = {});
  // Renders `source`'s figures (common/stats.h) with this registry's own until the handle is
  // reset or destroyed; the source must outlive the handle. Its families and series exist (at
  // zero) from this call on, and series it reports later from their first rendering. When it leaves, its counters' last values stay in their series, so
  // that process-wide counters never go down (several instances in one process, in tests, add
  // up while they live and after); its gauges leave with it.
  [[nodiscard]] SourceHandle AddSource(const stats::Source* source);
  // Prometheus text exposition format 0.0.4.
  std::string RenderPrometheus() const;
  // Value of a counter (in its exposed unit) or gauge by name and labels, for tests and
  // `shardctl status`; -1 if absent.
  double ValueOf(const std::string& name, const Labels& labels = {}) const;

  static Registry& Global();

 private:
  enum class Kind { kCounter, kGauge, kHistogram };
  struct Family {
    Kind kind;
    std::string help;
    double unit = 1;  // counters: exposed value = stored count x unit
    std::map<std::string, std::unique_ptr<Counter>> counters;   // key: rendered labels
    std::map<std::string, std::unique_ptr<Gauge>> gauges;
    std::map<std::string, std::unique_ptr<Histogram>> histograms;
  };
  // Sums of the live sources' figures: family name → rendered labels → (count, gauge value).
  using Overlay = std::map<std::string, std::map<std::string, std::pair<uint64_t, double>>>;
  friend class SourceHandle;
  void RemoveSource(const stats::Source* source);
  Overlay VisitSources() const REQUIRES(sources_mu_);
  Family& FamilyFor(const std::string& name, const std::string& help, Kind kind, double unit = 1) const
      REQUIRES(mu_);
  // Series for every figure the live sources report now: a source may report series it did
  // not have when it was added (a label per peer group member, say).
  void AddSeries(const stats::Source& source) const REQUIRES(mu_);

  mutable Mutex sources_mu_;
  std::vector<const stats::Source*> sources_ GUARDED_BY(sources_mu_);
  mutable Mutex mu_ ACQUIRED_AFTER(sources_mu_);
  mutable std::map<std::string, Family> families_ GUARDED_BY(mu_);  // grows while rendering
};

}  // namespace shardcache::metrics
