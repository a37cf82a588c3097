#include "daemon/admin/admin_server.h"

#include <algorithm>
#include <set>

#include <httplib.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "common/host_port.h"
#include "common/metrics.h"
#include "common/thread_name.h"

namespace shardcache::admin {
namespace {

// A JSON reply. Request paths and parameters are whatever a client sent: bytes that are not
// UTF-8 are replaced, not thrown over (an uncaught exception in a handler ends the daemon; a
// GET of /%ff once did).
std::string JsonText(const nlohmann::json& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
}

int HttpCodeFor(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return 200;
    case StatusCode::kInvalidArgument: return 400;
    case StatusCode::kNotFound: return 404;
    case StatusCode::kFailedPrecondition: return 409;
    case StatusCode::kPermissionDenied: return 403;
    case StatusCode::kUnimplemented: return 501;
    case StatusCode::kUnavailable: return 503;
    default: return 500;
  }
}

metrics::Counter* RequestCounter(const std::string& path) {
  return metrics::Registry::Global().GetCounter("shardcache_admin_requests_total",
                                                "Requests to the admin HTTP endpoint", {{"path", path}});
}

}  // namespace

AdminServer::AdminServer(AdminOptions options, AdminHandlers handlers)
    : options_(std::move(options)), handlers_(std::move(handlers)) {
  if (options_.gpu_metrics) nvml_ = std::make_unique<NvmlMetrics>();
}

AdminServer::~AdminServer() { Stop(); }

void AdminServer::Route() {
  // Every path's request counter exists, at zero, from the start.
  for (const char* path : {"/metrics", "/status", "/ready", "/evict", "/drain"}) RequestCounter(path);
  auto& s = *server_;
  s.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    static auto* requests = RequestCounter("/metrics");
    requests->Add();
    process_metrics_.Update();
    if (nvml_) nvml_->Update();
    res.set_content(metrics::Registry::Global().RenderPrometheus(), "text/plain; version=0.0.4; charset=utf-8");
  });
  s.Get("/status", [this](const httplib::Request&, httplib::Response& res) {
    static auto* requests = RequestCounter("/status");
    requests->Add();
    process_metrics_.Update();
    res.set_content(handlers_.status_json(), "application/json");
  });
  s.Get("/ready", [this](const httplib::Request& req, httplib::Response& res) { ServeReady(req, res); });
  s.Post("/evict", [this](const httplib::Request& req, httplib::Response& res) { ServeEvict(req, res); });
  s.Post("/drain", [this](const httplib::Request& req, httplib::Response& res) {
    static auto* requests = RequestCounter("/drain");
    requests->Add();
    spdlog::info("admin: drain requested from {}", req.remote_addr);
    handlers_.drain();
    res.status = 202;
    res.set_content("{\"draining\":true}\n", "application/json");
  });
  s.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    nlohmann::json reply;
    reply["error"] = res.status == 404 ? "no such endpoint " + req.path +
                                             " (try /metrics, /status, /ready, POST /evict?dataset=NAME, POST /drain)"
                                       : "HTTP " + std::to_string(res.status);
    res.set_content(JsonText(reply), "application/json");
  });
}

void AdminServer::ServeReady(const httplib::Request& req, httplib::Response& res) {
  static auto* requests = RequestCounter("/ready");
  requests->Add();
  std::set<std::string> excluded;
  for (size_t i = 0; i < req.get_param_value_count("exclude"); ++i) {
    const std::string check = req.get_param_value("exclude", i);
    if (std::find(std::begin(kReadinessChecks), std::end(kReadinessChecks), check) == std::end(kReadinessChecks)) {
      res.status = 400;
      res.set_content("unknown check '" + check + "' in exclude= (upstream, cache_disk)\n", "text/plain");
      return;
    }
    excluded.insert(check);
  }
  const Readiness r = handlers_.ready();
  if (!r.serving) {
    res.status = 503;
    res.set_content("starting\n", "text/plain");
    return;
  }
  std::string failing, ignored;
  for (const auto& [check, problem] : r.failing) {
    if (excluded.count(check)) ignored += "excluded " + check + ": " + problem + "\n";
    else failing += check + ": " + problem + "\n";
  }
  res.status = failing.empty() ? 200 : 503;
  res.set_content(failing.empty() ? "ready\n" + ignored : "degraded\n" + failing + ignored, "text/plain");
}

void AdminServer::ServeEvict(const httplib::Request& req, httplib::Response& res) {
  static auto* requests = RequestCounter("/evict");
  requests->Add();
  nlohmann::json reply;
  if (!req.has_param("dataset") || req.get_param_value("dataset").empty()) {
    res.status = 400;
    reply["error"] = "missing query parameter dataset=NAME";
  } else {
    const std::string dataset = req.get_param_value("dataset");
    Status st = handlers_.evict(dataset);
    res.status = HttpCodeFor(st.code());
    reply["dataset"] = dataset;
    if (st.ok()) {
      reply["evicted"] = true;
      spdlog::info("admin: evicted dataset '{}' on request from {}", dataset, req.remote_addr);
    } else {
      reply["evicted"] = false;
      reply["error"] = st.ToString();
    }
  }
  res.set_content(JsonText(reply), "application/json");
}

Status AdminServer::Start() {
  std::string host;
  int port = 0;
  SC_RETURN_IF_ERROR(SplitHostPort(options_.listen, &host, &port).WithContext("listen.metrics"));
  server_ = std::make_unique<httplib::Server>();
  const int threads = options_.threads;
  server_->new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  // httplib's default sets SO_REUSEPORT, which would let a second daemon share the port
  // silently; SO_REUSEADDR alone still allows a quick restart.
  server_->set_socket_options([](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
  });
  Route();
  if (port == 0) {
    port_ = server_->bind_to_any_port(host);
    if (port_ < 0) port_ = 0;
  } else if (server_->bind_to_port(host, port)) {
    port_ = port;
  }
  if (port_ == 0) {
    server_.reset();
    return Unavailable("listen.metrics: cannot bind " + options_.listen +
                       " (address in use, or not an address of this host)");
  }
  thread_ = std::thread([this] {
    NameThisThread("sc-admin-http");
    server_->listen_after_bind();
  });
  // httplib's stop() is a no-op until the listen loop runs; wait for it so that a Stop()
  // right after Start() cannot leave the loop running forever.
  while (!server_->is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  spdlog::info("admin HTTP on {}:{} (/metrics /status /ready /evict /drain)", host, port_);
  return Status::Ok();
}

void AdminServer::Stop() {
  if (server_) server_->stop();
  if (thread_.joinable()) thread_.join();
  server_.reset();
}

}  // namespace shardcache::admin
