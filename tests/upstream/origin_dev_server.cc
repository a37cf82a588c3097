// sc_origin_dev_server: a minimal Origin server over a directory (FileSource + OriginService),
// for tests and benchmarks that need the origin as its own process before `shardcached`
// with a file upstream is available. Not installed; the daemon is the real thing.
//
//   sc_origin_dev_server --root DIR [--listen 127.0.0.1:0] [--port-file F] [--token T]
//                        [--tls-cert F --tls-key F [--tls-ca F] [--require-client-cert]]
// Writes the bound port to --port-file once serving; runs until SIGINT/SIGTERM.
#include <csignal>
#include <cstdio>

#include <CLI/CLI.hpp>

#include "common/fs.h"
#include "common/log.h"
#include "daemon/serve/origin_service.h"
#include "daemon/upstream/file_source.h"

int main(int argc, char** argv) {
  using namespace shardcache;
  CLI::App app{"Origin service over a directory (development server)"};
  std::string root, port_file, log_level = "warn";
  serve::ServerOptions so;
  so.listen = "127.0.0.1:0";
  app.add_option("--root", root, "Directory holding datasets")->required();
  app.add_option("--listen", so.listen)->capture_default_str();
  app.add_option("--port-file", port_file);
  app.add_option("--token", so.token);
  app.add_option("--tls-cert", so.tls_cert);
  app.add_option("--tls-key", so.tls_key);
  app.add_option("--tls-ca", so.tls_ca);
  app.add_flag("--require-client-cert", so.require_client_cert);
  app.add_option("--log-level", log_level)->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  if (!SetupLogging(log_level).ok()) return 2;

  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);  // before gRPC starts its threads

  auto src = upstream::FileSource::Open(root);
  if (!src.ok()) {
    std::fprintf(stderr, "%s\n", src.status().ToString().c_str());
    return 1;
  }
  auto server = serve::StartOriginServer(**src, so);
  if (!server.ok()) {
    std::fprintf(stderr, "%s\n", server.status().ToString().c_str());
    return 1;
  }
  if (!port_file.empty()) {
    Status s = WriteFileAtomic(port_file, std::to_string((*server)->port()) + "\n");
    if (!s.ok()) {
      std::fprintf(stderr, "%s\n", s.ToString().c_str());
      return 1;
    }
  }
  std::printf("listening on port %d\n", (*server)->port());
  std::fflush(stdout);
  int sig = 0;
  sigwait(&set, &sig);
  return 0;
}
