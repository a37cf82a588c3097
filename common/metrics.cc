#include "common/metrics.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>
#include <stdexcept>
#include <utility>

namespace shardcache::metrics {
namespace {

std::string EscapeLabel(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\' || c == '"') out += '\\';
    if (c == '\n') { out += "\\n"; continue; }
    out += c;
  }
  return out;
}

std::string RenderLabels(const Labels& labels, const std::string& extra = "") {
  std::string out;
  for (const auto& [k, v] : labels) {
    if (!out.empty()) out += ',';
    out += k + "=\"" + EscapeLabel(v) + "\"";
  }
  if (!extra.empty()) {
    if (!out.empty()) out += ',';
    out += extra;
  }
  return out.empty() ? "" : "{" + out + "}";
}

std::string FormatDouble(double v) {
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

}  // namespace

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), buckets_(new std::atomic<uint64_t>[bounds_.size() + 1]) {
  for (size_t i = 0; i <= bounds_.size(); ++i) buckets_[i].store(0);
}

void Histogram::Observe(double v) {
  size_t i = 0;
  while (i < bounds_.size() && v > bounds_[i]) ++i;
  buckets_[i].fetch_add(1, std::memory_order_relaxed);
  count_.fetch_add(1, std::memory_order_relaxed);
  double cur = sum_.load(std::memory_order_relaxed);
  while (!sum_.compare_exchange_weak(cur, cur + v, std::memory_order_relaxed)) {}
}

std::vector<uint64_t> Histogram::BucketCounts() const {
  std::vector<uint64_t> out(bounds_.size() + 1);
  for (size_t i = 0; i <= bounds_.size(); ++i) out[i] = buckets_[i].load(std::memory_order_relaxed);
  return out;
}

double Histogram::Quantile(double q) const {
  const auto counts = BucketCounts();
  uint64_t total = 0;
  for (auto c : counts) total += c;
  if (total == 0) return 0;
  const double target = q * static_cast<double>(total);
  uint64_t seen = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    if (seen + counts[i] >= target && counts[i] > 0) {
      const double lo = i == 0 ? 0 : bounds_[i - 1];
      const double hi = i < bounds_.size() ? bounds_[i] : lo * 2;
      const double frac = (target - static_cast<double>(seen)) / static_cast<double>(counts[i]);
      return lo + (hi - lo) * frac;
    }
    seen += counts[i];
  }
  return bounds_.empty() ? 0 : bounds_.back();
}

std::vector<double> LatencyBuckets() {
  std::vector<double> b;
  for (double v = 10e-6; v < 20; v *= 2) b.push_back(v);
  return b;
}

Registry::Family& Registry::FamilyFor(const std::string& name, const std::string& help, Kind kind,
                                      double unit) const {
  auto it = families_.find(name);
  if (it == families_.end()) {
    it = families_.emplace(name, Family{kind, help, unit, {}, {}, {}}).first;
  } else if (it->second.kind != kind || it->second.unit != unit) {
    throw std::logic_error("metric " + name + " registered with two kinds or units");
  }
  return it->second;
}

Counter* Registry::GetCounter(const std::string& name, const std::string& help, const Labels& labels) {
  return GetScaledCounter(name, help, 1, labels);
}

Counter* Registry::GetScaledCounter(const std::string& name, const std::string& help, double unit,
                                    const Labels& labels) {
  MutexLock lock(&mu_);
  auto& slot = FamilyFor(name, help, Kind::kCounter, unit).counters[RenderLabels(labels)];
  if (!slot) slot = std::make_unique<Counter>();
  return slot.get();
}

Gauge* Registry::GetGauge(const std::string& name, const std::string& help, const Labels& labels) {
  MutexLock lock(&mu_);
  auto& slot = FamilyFor(name, help, Kind::kGauge).gauges[RenderLabels(labels)];
  if (!slot) slot = std::make_unique<Gauge>();
  return slot.get();
}

Histogram* Registry::GetHistogram(const std::string& name, const std::string& help,
                                  std::vector<double> bounds, const Labels& labels) {
  MutexLock lock(&mu_);
  auto& slot = FamilyFor(name, help, Kind::kHistogram).histograms[RenderLabels(labels)];
  if (!slot) slot = std::make_unique<Histogram>(std::move(bounds));
  return slot.get();
}

SourceHandle& SourceHandle::operator=(SourceHandle&& o) noexcept {
  if (this != &o) {
    Reset();
    registry_ = std::exchange(o.registry_, nullptr);
    source_ = std::exchange(o.source_, nullptr);
  }
  return *this;
}

void SourceHandle::Reset() {
  if (registry_ != nullptr && source_ != nullptr) registry_->RemoveSource(source_);
  registry_ = nullptr;
  source_ = nullptr;
}

namespace {

// One figure a source reported, copied out of the visit.
struct Reported {
  std::string name, help, labels;  // labels: rendered
  stats::Kind kind;
  uint64_t count;
  double value;
  double unit;
};

std::vector<Reported> Visit(const stats::Source& source) {
  std::vector<Reported> out;
  source.VisitStats([&](const stats::Stat& s) {
    out.push_back(Reported{std::string(s.name), std::string(s.help), s.labels ? RenderLabels(*s.labels) : "",
                           s.kind, s.count, s.value, s.unit});
  });
  return out;
}

}  // namespace

void Registry::AddSeries(const stats::Source& source) const {
  for (const auto& f : Visit(source)) {
    if (f.kind == stats::Kind::kCounter) {
      auto& slot = FamilyFor(f.name, f.help, Kind::kCounter, f.unit).counters[f.labels];
      if (!slot) slot = std::make_unique<Counter>();
    } else {
      auto& slot = FamilyFor(f.name, f.help, Kind::kGauge).gauges[f.labels];
      if (!slot) slot = std::make_unique<Gauge>();
    }
  }
}

SourceHandle Registry::AddSource(const stats::Source* source) {
  MutexLock sources(&sources_mu_);
  {
    MutexLock lock(&mu_);
    AddSeries(*source);
  }
  sources_.push_back(source);
  return SourceHandle(this, source);
}

void Registry::RemoveSource(const stats::Source* source) {
  MutexLock sources(&sources_mu_);
  sources_.erase(std::remove(sources_.begin(), sources_.end(), source), sources_.end());
  const std::vector<Reported> figures = Visit(*source);
  MutexLock lock(&mu_);
  for (const auto& f : figures) {
    if (f.kind != stats::Kind::kCounter) continue;
    auto& slot = FamilyFor(f.name, f.help, Kind::kCounter, f.unit).counters[f.labels];
    if (!slot) slot = std::make_unique<Counter>();
    slot->Add(f.count);  // the series keeps what the source counted
  }
}

Registry::Overlay Registry::VisitSources() const {
  Overlay overlay;
  for (const stats::Source* source : sources_) {
    for (const auto& f : Visit(*source)) {
      auto& sum = overlay[f.name][f.labels];
      sum.first += f.count;
      sum.second += f.value;
    }
  }
  return overlay;
}

std::string Registry::RenderPrometheus() const {
  MutexLock sources(&sources_mu_);
  const Overlay overlay = VisitSources();
  const std::pair<uint64_t, double> none{0, 0};
  MutexLock lock(&mu_);
  for (const stats::Source* source : sources_) AddSeries(*source);
  std::ostringstream out;
  for (const auto& [name, f] : families_) {
    const auto ov_family = overlay.find(name);
    auto live = [&](const std::string& labels) -> const std::pair<uint64_t, double>& {
      if (ov_family == overlay.end()) return none;
      const auto it = ov_family->second.find(labels);
      return it == ov_family->second.end() ? none : it->second;
    };
    out << "# HELP " << name << ' ' << f.help << '\n';
    switch (f.kind) {
      case Kind::kCounter:
        out << "# TYPE " << name << " counter\n";
        for (const auto& [l, c] : f.counters) {
          const uint64_t v = c->Value() + live(l).first;
          out << name << l << ' ';
          if (f.unit == 1) out << v << '\n';
          else out << FormatDouble(static_cast<double>(v) * f.unit) << '\n';
        }
        break;
      case Kind::kGauge:
        out << "# TYPE " << name << " gauge\n";
        for (const auto& [l, g] : f.gauges) {
          out << name << l << ' ' << FormatDouble(g->Value() + live(l).second) << '\n';
        }
        break;
      case Kind::kHistogram: {
        out << "# TYPE " << name << " histogram\n";
        for (const auto& [l, h] : f.histograms) {
          // Re-open the rendered label set to append le="...".
          const std::string inner = l.empty() ? "" : l.substr(1, l.size() - 2);
          auto with_le = [&](const std::string& le) {
            std::string s = inner.empty() ? "" : inner + ",";
            return "{" + s + "le=\"" + le + "\"}";
          };
          const auto counts = h->BucketCounts();
          uint64_t cum = 0;
          for (size_t i = 0; i < h->bounds().size(); ++i) {
            cum += counts[i];
            out << name << "_bucket" << with_le(FormatDouble(h->bounds()[i])) << ' ' << cum << '\n';
          }
          cum += counts.back();
          out << name << "_bucket" << with_le("+Inf") << ' ' << cum << '\n';
          out << name << "_sum" << l << ' ' << FormatDouble(h->Sum()) << '\n';
          out << name << "_count" << l << ' ' << h->Count() << '\n';
        }
        break;
      }
    }
  }
  return out.str();
}

double Registry::ValueOf(const std::string& name, const Labels& labels) const {
  MutexLock sources(&sources_mu_);
  const Overlay overlay = VisitSources();
  MutexLock lock(&mu_);
  auto it = families_.find(name);
  if (it == families_.end()) return -1;
  const std::string key = RenderLabels(labels);
  std::pair<uint64_t, double> live{0, 0};
  if (auto o = overlay.find(name); o != overlay.end()) {
    if (auto l = o->second.find(key); l != o->second.end()) live = l->second;
  }
  if (auto c = it->second.counters.find(key); c != it->second.counters.end()) {
    return static_cast<double>(c->second->Value() + live.first) * it->second.unit;
  }
  if (auto g = it->second.gauges.find(key); g != it->second.gauges.end()) return g->second->Value() + live.second;
  return -1;
}

Registry& Registry::Global() {
  static Registry* r = new Registry();  // never destroyed: metrics outlive every thread
  return *r;
}

}  // namespace shardcache::metrics
