// Statistics: how a component reports what it counts, once, for every consumer (navy's
// `getCounters`).
//
// A component that counts events owns its counters (plain atomics it also reads for its own
// Stats() struct) and implements stats::Source: VisitStats reports each figure with its
// Prometheus name, HELP text, labels and value. metrics::Registry::AddSource renders the live
// sources into /metrics beside the metrics registered in it, and `/status` and `shardctl`
// read the same atomics through the component's Stats(). So one counted event has one owner:
// never an atomic of the component plus a Registry counter bumped side by side.
//
// Contract for VisitStats: it reports the same series (name + labels) on every call, counters
// in integer counts (of their unit) and gauges as they are now; it is called from the
// /metrics thread at any time, so it reads atomics or takes only the component's own leaf
// locks (never one held while registering metrics or adding a source).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace shardcache::stats {

using Labels = std::vector<std::pair<std::string, std::string>>;

enum class Kind { kCounter, kGauge };

// A family's name and HELP text, declared once (a constexpr beside the component that reports
// it) and used both to register the family and to report into it.
struct Family {
  const char* name;
  const char* help;
};

// One figure, as a visitor sees it. The views live for the duration of the call.
struct Stat {
  std::string_view name;  // Prometheus family name: shardcache_<component>_<what>[_total]
  std::string_view help;  // HELP text; one per family
  Kind kind = Kind::kCounter;
  const Labels* labels = nullptr;  // null: none
  uint64_t count = 0;              // kCounter
  double value = 0;                // kGauge
  double unit = 1;                 // kCounter: exposed value = count x unit (metrics.h)
};

using Visitor = std::function<void(const Stat&)>;

// Shorthands for VisitStats implementations.
inline void Counter(const Visitor& visit, const Family& family, uint64_t count, const Labels* labels = nullptr) {
  visit(Stat{family.name, family.help, Kind::kCounter, labels, count, 0});
}
// A counter kept in integer multiples of `unit` (1e-6: microseconds), exposed in its base unit.
inline void ScaledCounter(const Visitor& visit, const Family& family, uint64_t count, double unit,
                          const Labels* labels = nullptr) {
  visit(Stat{family.name, family.help, Kind::kCounter, labels, count, 0, unit});
}
inline void Gauge(const Visitor& visit, const Family& family, double value, const Labels* labels = nullptr) {
  visit(Stat{family.name, family.help, Kind::kGauge, labels, 0, value});
}

// A component whose figures the Registry renders (see the contract above).
class Source {
 public:
  virtual ~Source() = default;
  virtual void VisitStats(const Visitor& visit) const = 0;
};

}  // namespace shardcache::stats
