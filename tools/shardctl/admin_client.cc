#include "tools/shardctl/admin_client.h"

#include <cctype>
#include <cstdio>
#include <cstdlib>

#include <httplib.h>

#include "config/config.h"

namespace shardcache::shardctl {

void AdminTarget::AddOptions(CLI::App* sub) {
  sub->add_option_function<std::string>(
         "--config", [this](const std::string& path) {
           config = path;
           config_given = true;
         },
         "the daemon's config, whose listen.metrics is the admin endpoint (default " +
             std::string(kDefaultConfigPath) + ")");
  sub->add_option("--metrics-addr", metrics_addr,
                  "the daemon's admin endpoint HOST:PORT (default: listen.metrics of --config, else " +
                      std::string(admin::kDefaultListen) + ")");
}

Result<std::string> AdminTarget::Resolve(std::string* origin) const {
  if (!metrics_addr.empty()) {
    *origin = "--metrics-addr";
    return metrics_addr;
  }
  auto c = config::LoadConfig(config, config::ReferencedFiles::kSkip);
  if (c.ok()) {
    if (c->listen.metrics.empty()) {
      return FailedPrecondition("the daemon's admin endpoint is off (listen.metrics = \"\" in " + config +
                                "); set it there, or pass --metrics-addr");
    }
    *origin = "listen.metrics in " + config;
    return c->listen.metrics;
  }
  // First line only: a refused config lists every problem on lines of their own.
  const std::string why = c.status().message().substr(0, c.status().message().find('\n'));
  *origin = "the default address; " + why;
  if (config_given) std::fprintf(stderr, "shardctl: cannot use --config %s (%s); trying %s\n", config.c_str(),
                                 why.c_str(), admin::kDefaultListen);
  return std::string(admin::kDefaultListen);
}

Result<AdminClient> AdminClient::For(const AdminTarget& target) {
  std::string origin;
  SC_ASSIGN_OR_RETURN(std::string address, target.Resolve(&origin));
  return AdminClient(std::move(address), std::move(origin));
}

Result<std::string> AdminClient::Request(bool post, const std::string& path, int timeout_ms) {
  std::string host = address_;
  int port = 80;
  if (host.rfind("http://", 0) == 0) host = host.substr(7);
  const size_t colon = host.rfind(':');
  if (colon != std::string::npos) {
    port = std::atoi(host.c_str() + colon + 1);
    host = host.substr(0, colon);
  }
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  if (host.empty() || port <= 0 || port > 65535) {
    return InvalidArgument("admin address '" + address_ + "' (" + origin_ + ") is not host:port");
  }
  httplib::Client cli(host, port);
  cli.set_connection_timeout(std::chrono::milliseconds(timeout_ms));
  cli.set_read_timeout(std::chrono::milliseconds(timeout_ms));
  auto res = post ? cli.Post(path.c_str()) : cli.Get(path.c_str());
  if (!res) {
    return Unavailable("cannot reach shardcached at " + address_ + " (" +
                       (origin_.empty() ? "" : origin_ + ": ") + httplib::to_string(res.error()) +
                       "); is it running, and is this its listen.metrics? (--config PATH, --metrics-addr HOST:PORT)");
  }
  if (res->status / 100 != 2) {
    return Status(res->status == 404 ? StatusCode::kNotFound
                  : res->status == 400 ? StatusCode::kInvalidArgument
                  : res->status == 409 ? StatusCode::kFailedPrecondition
                  : StatusCode::kInternal,
                  "HTTP " + std::to_string(res->status) + " from " + address_ + path + ": " + res->body);
  }
  return res->body;
}

Result<std::string> AdminClient::Get(const std::string& path, int timeout_ms) { return Request(false, path, timeout_ms); }
Result<std::string> AdminClient::Post(const std::string& path, int timeout_ms) { return Request(true, path, timeout_ms); }

Result<Samples> ParsePrometheusText(const std::string& text) {
  Samples out;
  size_t pos = 0, line_no = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    const std::string line = text.substr(pos, end - pos);
    pos = end + 1;
    ++line_no;
    if (line.empty() || line[0] == '#') continue;
    // name{labels} value [timestamp]; label values may hold spaces and escaped quotes.
    size_t i = 0;
    while (i < line.size() && (std::isalnum(static_cast<unsigned char>(line[i])) || line[i] == '_' || line[i] == ':')) ++i;
    if (i == 0) return InvalidArgument("metrics line " + std::to_string(line_no) + ": no metric name: " + line);
    if (i < line.size() && line[i] == '{') {
      bool in_quotes = false;
      for (++i; i < line.size(); ++i) {
        if (in_quotes && line[i] == '\\') { ++i; continue; }
        if (line[i] == '"') in_quotes = !in_quotes;
        else if (line[i] == '}' && !in_quotes) break;
      }
      if (i >= line.size()) return InvalidArgument("metrics line " + std::to_string(line_no) + ": unterminated labels");
      ++i;
    }
    const std::string key = line.substr(0, i);
    const char* v = line.c_str() + i;
    while (*v == ' ') ++v;
    char* vend = nullptr;
    double value = std::strtod(v, &vend);
    if (vend == v) {
      if (std::string(v).rfind("+Inf", 0) == 0) value = HUGE_VAL;
      else if (std::string(v).rfind("-Inf", 0) == 0) value = -HUGE_VAL;
      else return InvalidArgument("metrics line " + std::to_string(line_no) + ": bad value: " + line);
    }
    out[key] = value;
  }
  return out;
}

double Value(const Samples& s, const std::string& key, double fallback) {
  auto it = s.find(key);
  return it == s.end() ? fallback : it->second;
}

std::map<std::string, double> Series(const Samples& s, const std::string& name) {
  std::map<std::string, double> out;
  for (auto it = s.lower_bound(name); it != s.end() && it->first.compare(0, name.size(), name) == 0; ++it) {
    const std::string rest = it->first.substr(name.size());
    if (rest.empty()) out[""] = it->second;
    else if (rest.front() == '{') out[rest.substr(1, rest.size() - 2)] = it->second;
  }
  return out;
}

double Sum(const Samples& s, const std::string& name) {
  double total = 0;
  for (const auto& [labels, v] : Series(s, name)) total += v;
  return total;
}

std::string LabelValue(const std::string& labels, const std::string& label) {
  const std::string needle = label + "=\"";
  size_t p = 0;
  while ((p = labels.find(needle, p)) != std::string::npos) {
    if (p == 0 || labels[p - 1] == ',') {
      std::string out;
      for (size_t i = p + needle.size(); i < labels.size() && labels[i] != '"'; ++i) {
        if (labels[i] == '\\' && i + 1 < labels.size()) ++i;
        out += labels[i];
      }
      return out;
    }
    p += needle.size();
  }
  return "";
}

}  // namespace shardcache::shardctl
