// What the integration tests ask of a running shardcached: where its binaries are, the tail of
// its log, admin requests and metric sums from its admin port.
#pragma once

#include <httplib.h>

#include <chrono>
#include <cstdlib>
#include <sstream>
#include <string>
#include <utility>

#include "common/fs.h"
#include "testing/process.h"

namespace shardcache::testing {

// build/bin/NAME, or $SHARDCACHE_BIN_DIR/NAME (to test an installed build).
inline std::string Bin(const std::string& name) {
  if (const char* dir = std::getenv("SHARDCACHE_BIN_DIR"); dir && *dir) return std::string(dir) + "/" + name;
  return BinPath(name);
}

// The last 4000 bytes of a log file ("" when unreadable), for failure messages.
inline std::string LogTail(const std::string& path) {
  auto t = ReadFileToString(path);
  return t.ok() ? t->substr(t->size() > 4000 ? t->size() - 4000 : 0) : "";
}

// GET (or POST) `path` on 127.0.0.1:port: HTTP status and body; status -1 when unreachable.
inline std::pair<int, std::string> Http(int port, const std::string& path, bool post = false) {
  httplib::Client cli("127.0.0.1", port);
  cli.set_read_timeout(std::chrono::seconds(10));
  auto res = post ? cli.Post(path.c_str()) : cli.Get(path.c_str());
  if (!res) return {-1, ""};
  return {res->status, res->body};
}

// Sum of every sample of metric `name` (with or without labels) on 127.0.0.1:port/metrics;
// -1 when the endpoint does not answer.
inline double Metric(int port, const std::string& name) {
  httplib::Client cli("127.0.0.1", port);
  cli.set_read_timeout(std::chrono::seconds(10));
  auto res = cli.Get("/metrics");
  if (!res || res->status != 200) return -1;
  double sum = 0;
  std::istringstream in(res->body);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(name, 0) != 0) continue;
    const char next = line.size() > name.size() ? line[name.size()] : '\0';
    if (next != ' ' && next != '{') continue;
    sum += std::strtod(line.c_str() + line.rfind(' ') + 1, nullptr);
  }
  return sum;
}

}  // namespace shardcache::testing
