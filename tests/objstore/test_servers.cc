#include "objstore/test_servers.h"

#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <fstream>
#include <sstream>
#include <thread>

namespace shardcache::objstore::testing {

using shardcache::testing::FreePort;
using shardcache::testing::Process;
using shardcache::testing::RunCommand;
using shardcache::testing::WaitForPort;

namespace {

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Polls `ready` while `proc` runs (up to 20 s); fails the test with the program's log when it
// exits or never gets ready.
template <class Ready>
void WaitReady(Process& proc, const std::string& what, const std::string& log_path, Ready ready) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (!ready()) {
    if (!proc.Running() || std::chrono::steady_clock::now() > end) {
      FAIL(what << " did not start; its output:\n" << ReadFile(log_path));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

bool PortOpen(int port) { return WaitForPort(port, std::chrono::milliseconds(1)); }

}  // namespace

void RequireProgram(const std::string& program) {
  if (RunCommand("command -v " + program + " >/dev/null") != 0) {
    FAIL(program << " is not installed: run `make setup` (deploy/setup.sh installs the servers the "
                    "objstore tests start)");
  }
}

S3rver::S3rver(const std::string& bucket, const std::string& service_endpoint) {
  RequireProgram("s3rver");
  port_ = FreePort();
  // s3rver's continuation tokens use DES, which Node's OpenSSL 3 keeps in its legacy provider.
  std::vector<std::string> argv = {"env", "NODE_OPTIONS=--openssl-legacy-provider", "s3rver", "-d", dir_ / "data",
                                   "-a", "127.0.0.1", "-p", std::to_string(port_), "-s",
                                   "--configure-bucket", bucket};
  if (!service_endpoint.empty()) {
    argv.push_back("--service-endpoint");
    argv.push_back(service_endpoint);
  }
  proc_ = std::make_unique<Process>(argv, dir_ / "s3rver.log");
  WaitReady(*proc_, "s3rver", dir_ / "s3rver.log", [&] { return PortOpen(port_); });
}

Nginx::Nginx(const std::string& root) {
  RequireProgram("nginx");
  RequireProgram("openssl");
  std::string out;
  const int rc = RunCommand("openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 "
                            "-subj /CN=127.0.0.1 -addext subjectAltName=IP:127.0.0.1 -keyout " +
                                (dir_ / "key.pem") + " -out " + (dir_ / "cert.pem"),
                            &out);
  INFO(out);
  REQUIRE(rc == 0);
  http_port_ = FreePort();
  https_port_ = FreePort();
  const std::string p = dir_.path();
  std::ofstream conf(dir_ / "nginx.conf");
  // Started as root, nginx workers drop to "nobody", who cannot read the 0700 temp dirs.
  conf << "daemon off;\n" << (::geteuid() == 0 ? "user root;\n" : "") << "worker_processes 1;\npid " << p
       << "/nginx.pid;\nerror_log " << p << "/error.log warn;\nevents { worker_connections 256; }\n"
       << "http {\n  access_log off;\n  client_body_temp_path " << p << "/body;\n  proxy_temp_path " << p
       << "/proxy;\n  fastcgi_temp_path " << p << "/fastcgi;\n  uwsgi_temp_path " << p << "/uwsgi;\n"
       << "  scgi_temp_path " << p << "/scgi;\n  keepalive_requests 100000;\n"
       << "  server {\n    listen 127.0.0.1:" << http_port_ << ";\n    listen 127.0.0.1:" << https_port_
       << " ssl;\n    ssl_certificate " << p << "/cert.pem;\n    ssl_certificate_key " << p
       << "/key.pem;\n    root " << root << ";\n  }\n}\n";
  conf.close();
  proc_ = std::make_unique<Process>(std::vector<std::string>{"nginx", "-p", p, "-c", dir_ / "nginx.conf"},
                                    dir_ / "nginx.log");
  WaitReady(*proc_, "nginx", dir_ / "nginx.log", [&] { return PortOpen(http_port_) && PortOpen(https_port_); });
}

FaultServer::FaultServer(const std::string& mode, size_t size) {
  // Debian's interpreter, whose packages (python3-botocore) deploy/setup.sh installs.
  const std::string python = ::access("/usr/bin/python3", X_OK) == 0 ? "/usr/bin/python3" : "python3";
  RequireProgram(python);
  proc_ = std::make_unique<Process>(
      std::vector<std::string>{python, std::string(SC_SOURCE_DIR) + "/tests/objstore/fault_server.py",
                               dir_ / "port", mode, std::to_string(size)},
      dir_ / "requests.log");
  WaitReady(*proc_, "fault_server.py", dir_ / "requests.log", [&] { return ::access((dir_ / "port").c_str(), F_OK) == 0; });
  port_ = std::stoi(ReadFile(dir_ / "port"));
}

std::string FaultServer::RequestLog() const { return ReadFile(dir_ / "requests.log"); }

std::unique_ptr<ObjectClient> OpenClient(const std::string& uri, const ObjectStoreOptions& o) {
  auto parsed = ParseObjectUri(uri);
  REQUIRE(parsed.ok());
  auto client = ObjectClient::Open(*parsed, o);
  INFO(client.status().ToString());
  REQUIRE(client.ok());
  return std::move(*client);
}

}  // namespace shardcache::objstore::testing
