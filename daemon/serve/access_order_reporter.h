// AccessOrderReporter: tells the cache the node's future chunk order, for its clairvoyant policy.
//
// The plan fixes what every loader reads next. Ranks of one job are strided over the job's
// global order (daemon/plan), so the node's reads for a job follow the global order restricted
// to the ranks open on this node. The loader factory notes each loader it opens (NoteLoader);
// for each plan in use (plan parameters, world size and start position), a background thread
// reports to options.observer the chunk order of the rest of the epoch from the earliest local
// loader's position, followed by the whole next epoch (epoch + 1, same parameters), consecutive
// repeats collapsed. Reports are coalesced over delay_ms (the ranks of a job open together) and
// repeated when another rank of the same plan opens, or a rank opens earlier in the epoch than
// before; a plan no loader holds any more is forgotten. The daemon wires the observer to
// CachedSource::SetFutureAccessOrder(version, access_plan().Now(version), order).
//
// Without an observer the reporter does nothing: Start() starts no thread and NoteLoader()
// records nothing.
//
// Thread safety: NoteLoader() from any thread; Start() and Stop() from one controlling thread
// (LocalService's). The observer is called on the reporter's thread, without its lock held.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/mutex.h"
#include "daemon/plan/epoch_plan.h"
#include "daemon/plan/rank_slice.h"
#include "daemon/serve/batch_assembler.h"

namespace shardcache::serve {

// One future chunk access, for an eviction policy that knows the future.
struct ChunkAccess {
  uint32_t shard = 0;
  uint64_t chunk = 0;
};
// Receives the node-wide future chunk order of a dataset. Called from the reporter's thread;
// must be thread-safe.
using AccessOrderObserver =
    std::function<void(const DatasetPtr& dataset, const std::vector<ChunkAccess>& order)>;

struct AccessOrderReporterOptions {
  // Receives the node's future chunk order per dataset. Optional: none, no reports.
  AccessOrderObserver observer;
  // Delay that coalesces loader openings into one report. Default: 200 ms.
  uint32_t delay_ms = 200;
};

class AccessOrderReporter {
 public:
  explicit AccessOrderReporter(AccessOrderReporterOptions options) : options_(std::move(options)) {}
  ~AccessOrderReporter() { Stop(); }
  AccessOrderReporter(const AccessOrderReporter&) = delete;
  AccessOrderReporter& operator=(const AccessOrderReporter&) = delete;

  // Starts the reporting thread (none without an observer); again after Stop().
  void Start();
  // Stops and joins the thread; reports not yet made are dropped. Idempotent.
  void Stop();
  bool enabled() const { return static_cast<bool>(options_.observer); }

  // Registers a loader's plan use: `slice` (its plan, world size, start position, rank and
  // resume point) read through `locator`. Holds neither: a plan no loader holds is forgotten.
  void NoteLoader(const DatasetPtr& dataset, const std::shared_ptr<SampleLocator>& locator,
                  const plan::RankSlice& slice);

 private:
  // The loaders of one plan (and world size and start position) open on this node.
  struct PlanUse {
    DatasetPtr dataset;
    std::weak_ptr<SampleLocator> locator;
    std::weak_ptr<const plan::EpochPlan> plan;
    uint32_t world_size = 1;
    uint64_t start_position = 0;
    std::map<uint32_t, uint64_t> rank_start;  // local rank → earliest rank start seen
    bool dirty = false;
  };
  void Loop();
  // Waits for a use to report, then for delay_ms more; the dirty uses (now clean), none when
  // stopping. Forgets the uses whose plan is gone.
  std::vector<PlanUse> NextReports() REQUIRES(mu_);
  // The chunk order of `u`'s ranks from their earliest position to the end of the next epoch.
  static std::vector<ChunkAccess> FutureOrder(const PlanUse& u, const plan::EpochPlan& plan,
                                              SampleLocator& locator);

  const AccessOrderReporterOptions options_;
  Mutex mu_;
  CondVar cv_;
  std::map<std::string, PlanUse> uses_ GUARDED_BY(mu_);  // by plan key, world size, start position
  bool stop_ GUARDED_BY(mu_) = false;
  std::thread thread_;  // Start/Stop's thread only
};

}  // namespace shardcache::serve
