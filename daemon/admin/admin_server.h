// AdminServer: the daemon's operator-facing HTTP endpoint on `listen.metrics` (cpp-httplib).
//
//   GET  /metrics               Prometheus text format 0.0.4: every metric in
//                               metrics::Registry::Global(), refreshed process and GPU gauges.
//   GET  /status                JSON status document (health, upstream, tiers, datasets, clients),
//                               produced by the daemon's StatusJson handler.
//   POST /evict?dataset=NAME    drops a dataset's chunks from the cache tiers; JSON reply.
//   POST /drain                 stops the daemon as SIGTERM does (trainers are disconnected and
//                               reconnect to its successor, the stop is bounded); 202 at once.
//   GET  /ready                 200 once the daemon serves (recovery done, servers up) and every
//                               check passes; 503 otherwise, the body saying why: "starting", or
//                               "degraded" and one "CHECK: problem" line per failing check
//                               (upstream, cache_disk). `?exclude=CHECK` (repeatable, as in
//                               Kubernetes' /readyz) ignores a check: a tier that should keep
//                               serving what it has cached while its upstream is down probes
//                               /ready?exclude=upstream.
//
// The endpoint is unauthenticated: keep it on loopback or behind a firewall (the default
// listen.metrics is 127.0.0.1:9750).
//
// Thread safety: Start()/Stop() from one controlling thread. Requests run on httplib's worker
// threads and call the handlers concurrently; handlers must be thread-safe.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/status.h"
#include "daemon/admin/nvml_metrics.h"
#include "daemon/admin/process_metrics.h"

namespace httplib {
class Server;
struct Request;
struct Response;
}

namespace shardcache::admin {

// Where the admin HTTP server listens unless configured (listen.metrics); shardctl asks here.
inline constexpr char kDefaultListen[] = "127.0.0.1:9750";

struct AdminOptions {
  // "host:port" or "[v6]:port". Default: kDefaultListen.
  std::string listen = kDefaultListen;
  // Worker threads serving requests. Default: 4 (scrapes and shardctl are rare and small).
  int threads = 4;
  // Load NVML for GPU metrics when present. Default: true.
  bool gpu_metrics = true;
};

// What /ready reports.
struct Readiness {
  bool serving = false;  // started, not stopping
  // Failing checks while serving: (check name, problem), e.g. ("upstream", "... unreachable").
  std::vector<std::pair<std::string, std::string>> failing;
};
// The checks /ready knows (and ?exclude= accepts).
inline constexpr const char* kReadinessChecks[] = {"upstream", "cache_disk"};

struct AdminHandlers {
  std::function<std::string()> status_json;                  // required
  std::function<Status(const std::string& dataset)> evict;   // required
  std::function<Readiness()> ready;                          // required
  std::function<void()> drain;                               // required; must not block
};

class AdminServer {
 public:
  AdminServer(AdminOptions options, AdminHandlers handlers);
  ~AdminServer();  // Stop()
  AdminServer(const AdminServer&) = delete;
  AdminServer& operator=(const AdminServer&) = delete;

  // Binds and starts serving. Unavailable naming the address when it cannot be bound;
  // InvalidArgument when it is not host:port.
  Status Start();
  void Stop();
  int port() const { return port_; }

 private:
  void Route();
  // GET /ready[?exclude=CHECK]: 200 "ready", 503 "starting" or "degraded" with the failing checks.
  void ServeReady(const httplib::Request& req, httplib::Response& res);
  // POST /evict?dataset=NAME: drops the dataset's chunks from every tier.
  void ServeEvict(const httplib::Request& req, httplib::Response& res);

  const AdminOptions options_;
  const AdminHandlers handlers_;
  std::unique_ptr<httplib::Server> server_;
  ProcessMetrics process_metrics_;
  std::unique_ptr<NvmlMetrics> nvml_;
  std::thread thread_;
  int port_ = 0;
};

}  // namespace shardcache::admin
