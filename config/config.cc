#include "config/config.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <sstream>

#include <spdlog/spdlog.h>
#include <toml++/toml.h>

#include "common/fs.h"
#include "common/host_port.h"
#include "common/units.h"
#include "daemon/upstream/upstream_uri.h"

namespace shardcache::config {
namespace {

// Collected problems, one "key: what" line each, so that a file is fixed in one round.
class Problems {
 public:
  void Add(const std::string& key, const std::string& what, const toml::node* at = nullptr) {
    std::string line = key + ": " + what;
    uint32_t at_line = kNoLine;
    if (at != nullptr && at->source().begin.line != 0) {
      at_line = at->source().begin.line;
      line += " (line " + std::to_string(at_line) + ")";
    }
    lines_.push_back({at_line, std::move(line)});
  }
  void AddRaw(std::string line) { lines_.push_back({0, std::move(line)}); }
  bool empty() const { return lines_.empty(); }
  // Problems in file order (toml++ iterates keys sorted by name); cross-key ones last.
  Status ToStatus(const std::string& where) {
    std::stable_sort(lines_.begin(), lines_.end(),
                     [](const auto& a, const auto& b) { return a.first < b.first; });
    std::string m = where + ": " + std::to_string(lines_.size()) +
                    (lines_.size() == 1 ? " problem" : " problems");
    for (const auto& l : lines_) m += "\n  " + l.second;
    return InvalidArgument(m);
  }

 private:
  static constexpr uint32_t kNoLine = ~0u;
  std::vector<std::pair<uint32_t, std::string>> lines_;
};

std::string TypeName(const toml::node& n) {
  switch (n.type()) {
    case toml::node_type::string: return "a string";
    case toml::node_type::integer: return "an integer";
    case toml::node_type::floating_point: return "a float";
    case toml::node_type::boolean: return "a boolean";
    case toml::node_type::array: return "an array";
    case toml::node_type::table: return "a table";
    default: return "a date/time";
  }
}

std::string Quote(const std::string& s) { return "'" + s + "'"; }

std::optional<std::string> ReadString(const toml::node& n, const std::string& key, Problems& p) {
  if (auto v = n.value_exact<std::string>()) return *v;
  p.Add(key, "expected a string, got " + TypeName(n), &n);
  return std::nullopt;
}

std::optional<bool> ReadBool(const toml::node& n, const std::string& key, Problems& p) {
  if (auto v = n.value_exact<bool>()) return *v;
  p.Add(key, "expected true or false, got " + TypeName(n), &n);
  return std::nullopt;
}

std::optional<uint32_t> ReadCount(const toml::node& n, const std::string& key, Problems& p,
                                  int64_t min, int64_t max) {
  auto v = n.value_exact<int64_t>();
  if (!v) {
    p.Add(key, "expected an integer, got " + TypeName(n), &n);
    return std::nullopt;
  }
  if (*v < min || *v > max) {
    p.Add(key, std::to_string(*v) + " is out of range [" + std::to_string(min) + ", " +
                   std::to_string(max) + "]", &n);
    return std::nullopt;
  }
  return static_cast<uint32_t>(*v);
}

// Sizes and rates: a string with a unit ("800GiB", "1Gbit") or a plain non-negative integer.
std::optional<uint64_t> ReadUnits(const toml::node& n, const std::string& key, Problems& p,
                                  Result<uint64_t> (*parse)(const std::string&),
                                  const char* what) {
  if (auto i = n.value_exact<int64_t>()) {
    if (*i < 0) {
      p.Add(key, std::to_string(*i) + " is negative", &n);
      return std::nullopt;
    }
    return static_cast<uint64_t>(*i);
  }
  if (auto s = n.value_exact<std::string>()) {
    auto r = parse(*s);
    if (!r.ok()) {
      p.Add(key, r.status().message(), &n);
      return std::nullopt;
    }
    return *r;
  }
  p.Add(key, std::string("expected ") + what + " (a string such as \"4MiB\" or an integer), got " +
                 TypeName(n), &n);
  return std::nullopt;
}

std::optional<uint64_t> ReadSize(const toml::node& n, const std::string& key, Problems& p) {
  return ReadUnits(n, key, p, &ParseBytes, "a size");
}
std::optional<uint64_t> ReadRate(const toml::node& n, const std::string& key, Problems& p) {
  return ReadUnits(n, key, p, &ParseRate, "a rate");
}

// A positive duration: "30s", "500ms", or an integer number of seconds.
std::optional<std::chrono::milliseconds> ReadDuration(const toml::node& n, const std::string& key, Problems& p) {
  std::optional<std::chrono::milliseconds> d;
  if (auto i = n.value_exact<int64_t>()) {
    if (*i > 0) d = std::chrono::seconds(*i);
  } else if (auto s = n.value_exact<std::string>()) {
    auto r = ParseDuration(*s);
    if (!r.ok()) {
      p.Add(key, r.status().message(), &n);
      return std::nullopt;
    }
    d = *r;
  } else {
    p.Add(key, "expected a duration such as \"30s\", got " + TypeName(n), &n);
    return std::nullopt;
  }
  if (!d || d->count() <= 0) {
    p.Add(key, "must be greater than zero", &n);
    return std::nullopt;
  }
  return d;
}

std::optional<std::vector<uint32_t>> ReadIdList(const toml::node& n, const std::string& key,
                                                Problems& p) {
  const toml::array* a = n.as_array();
  if (a == nullptr) {
    p.Add(key, "expected an array of integers, got " + TypeName(n), &n);
    return std::nullopt;
  }
  std::vector<uint32_t> out;
  bool ok = true;
  for (size_t i = 0; i < a->size(); ++i) {
    const std::string item_key = key + "[" + std::to_string(i) + "]";
    auto v = ReadCount(*a->get(i), item_key, p, 0, std::numeric_limits<uint32_t>::max() - 1);
    if (v) out.push_back(*v); else ok = false;
  }
  if (!ok) return std::nullopt;
  return out;
}

// An array of "host:port" addresses (peers.members).
std::optional<std::vector<std::string>> ReadAddressList(const toml::node& n, const std::string& key, Problems& p) {
  const toml::array* a = n.as_array();
  if (a == nullptr) {
    p.Add(key, "expected an array of \"host:port\" strings, got " + TypeName(n), &n);
    return std::nullopt;
  }
  std::vector<std::string> out;
  bool ok = true;
  for (size_t i = 0; i < a->size(); ++i) {
    const std::string item_key = key + "[" + std::to_string(i) + "]";
    auto v = ReadString(*a->get(i), item_key, p);
    if (v) {
      if (Status bad = CheckHostPort(*v); !bad.ok()) {
        p.Add(item_key, bad.message(), a->get(i));
        v.reset();
      }
    }
    if (v) out.push_back(*v); else ok = false;
  }
  if (!ok) return std::nullopt;
  return out;
}

// An array of "PREFIX=TOKEN_FILE" (checkpoints.writers).
std::optional<std::vector<Config::Checkpoints::Writer>> ReadCheckpointWriters(const toml::node& n,
                                                                              const std::string& key, Problems& p) {
  const toml::array* a = n.as_array();
  if (a == nullptr) {
    p.Add(key, "expected an array of \"PREFIX=TOKEN_FILE\" strings, got " + TypeName(n), &n);
    return std::nullopt;
  }
  std::vector<Config::Checkpoints::Writer> out;
  bool ok = true;
  for (size_t i = 0; i < a->size(); ++i) {
    const std::string item_key = key + "[" + std::to_string(i) + "]";
    auto v = ReadString(*a->get(i), item_key, p);
    if (!v) {
      ok = false;
      continue;
    }
    const size_t eq = v->find('=');
    Config::Checkpoints::Writer w;
    if (eq != std::string::npos) {
      w.prefix = v->substr(0, eq);
      w.token_file = v->substr(eq + 1);
    }
    if (eq == std::string::npos || w.prefix.empty() || w.prefix.back() != '/' || w.prefix[0] == '/' ||
        w.token_file.empty() || w.token_file[0] != '/') {
      p.Add(item_key, Quote(*v) + " is not PREFIX=TOKEN_FILE (a relative prefix ending in '/', an absolute file), "
                      "e.g. \"run7/=/etc/shardcache/run7.token\"", a->get(i));
      ok = false;
      continue;
    }
    out.push_back(std::move(w));
  }
  if (!ok) return std::nullopt;
  return out;
}

// An array of group names, as /etc/group spells them.
std::optional<std::vector<std::string>> ReadGroupNames(const toml::node& n, const std::string& key, Problems& p) {
  const toml::array* a = n.as_array();
  if (a == nullptr) {
    p.Add(key, "expected an array of group names, got " + TypeName(n), &n);
    return std::nullopt;
  }
  std::vector<std::string> out;
  bool ok = true;
  for (size_t i = 0; i < a->size(); ++i) {
    const std::string item_key = key + "[" + std::to_string(i) + "]";
    auto v = ReadString(*a->get(i), item_key, p);
    if (v && (v->empty() || v->find_first_of(": \t\n,") != std::string::npos)) {
      p.Add(item_key, Quote(*v) + " is not a group name", a->get(i));
      v.reset();
    }
    if (v) out.push_back(*v); else ok = false;
  }
  if (!ok) return std::nullopt;
  return out;
}

size_t EditDistance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] != b[j - 1] ? 1 : 0)});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

// One entry per accepted key: how to read it, and how to tell whether two configs differ in it.
struct KeySpec {
  std::string name;
  bool reloadable;
  std::function<void(const toml::node&, Config&, Problems&)> read;
  std::function<bool(const Config&, const Config&)> same;
};

#define SC_SAME(field) [](const Config& a, const Config& b) { return a.field == b.field; }

const std::vector<KeySpec>& Specs() {
  static const std::vector<KeySpec> specs = [] {
    std::vector<KeySpec> s;
    auto add = [&](std::string name, bool reloadable,
                   std::function<void(const std::string&, const toml::node&, Config&, Problems&)> read,
                   std::function<bool(const Config&, const Config&)> same) {
      std::string key = name;
      s.push_back({std::move(name), reloadable,
                   [key, read](const toml::node& n, Config& c, Problems& p) { read(key, n, c, p); },
                   std::move(same)});
    };
    using N = const toml::node&;
    add("upstream", false,
        [](const std::string& k, N n, Config& c, Problems& p) {
          if (auto v = ReadString(n, k, p)) {
            if (auto u = upstream::ParseUpstreamUri(*v); !u.ok()) p.Add(k, u.status().message(), &n);
            c.upstream = *v;
          }
        },
        SC_SAME(upstream));
    for (auto [name, member] : {std::pair{"listen.origin", &Config::Listen::origin},
                                std::pair{"listen.metrics", &Config::Listen::metrics}}) {
      auto field = member;  // a copy: lambdas cannot capture structured bindings before C++20
      add(name, false,
          [field](const std::string& k, N n, Config& c, Problems& p) {
            if (auto v = ReadString(n, k, p)) {
              if (!v->empty()) {
                if (Status bad = CheckHostPort(*v); !bad.ok()) p.Add(k, bad.message(), &n);
              }
              c.listen.*field = *v;
            }
          },
          [field](const Config& a, const Config& b) { return a.listen.*field == b.listen.*field; });
    }
    add("listen.socket", false,
        [](const std::string& k, N n, Config& c, Problems& p) {
          if (auto v = ReadString(n, k, p)) {
            if (!v->empty() && v->front() != '/') p.Add(k, Quote(*v) + " is not an absolute path", &n);
            // sockaddr_un.sun_path holds 108 bytes including the terminating NUL.
            if (v->size() > 107) p.Add(k, "path is longer than the 107 bytes a Unix socket allows", &n);
            c.listen.socket = *v;
          }
        },
        SC_SAME(listen.socket));
    add("cache.dir", false,
        [](const std::string& k, N n, Config& c, Problems& p) {
          if (auto v = ReadString(n, k, p)) {
            if (!v->empty() && v->front() != '/') p.Add(k, Quote(*v) + " is not an absolute path", &n);
            c.cache.dir = *v;
          }
        },
        SC_SAME(cache.dir));
    add("cache.require_mount", false,
        [](const std::string& k, N n, Config& c, Problems& p) {
          if (auto v = ReadBool(n, k, p)) c.cache.require_mount = *v;
        },
        SC_SAME(cache.require_mount));
    add("cache.size", true,
        [](const std::string& k, N n, Config& c, Problems& p) {
          if (auto v = ReadSize(n, k, p)) c.cache.size_bytes = *v;
        },
        SC_SAME(cache.size_bytes));
    add("cache.memory_size", false,
        [](const std::string& k, N n, Config& c, Problems& p) {
          if (auto v = ReadSize(n, k, p)) c.cache.memory_bytes = *v;
        },
        SC_SAME(cache.memory_bytes));
    add("cache.min_free", false,
        [](const std::string& k, N n, Config& c, Problems& p) {
          if (auto s = n.value_exact<std::string>(); s && !s->empty() && s->back() == '%') {
            auto percent = cache::ParseMinFree(*s);
            if (percent.ok()) c.cache.min_free = *percent;
            else p.Add(k, percent.status().message(), &n);
            return;
          }
          if (auto v = ReadSize(n, k, p)) c.cache.min_free = cache::MinFree{0, *v};
        },
        SC_SAME(cache.min_free));
    add("cache.eviction", false,
        [](const std::string& k, N n, Config& c, Problems& p) {
          if (auto v = ReadString(n, k, p)) {
            auto policy = cache::ParseEvictionPolicy(*v);
            if (policy.ok()) c.cache.eviction = *policy;
            else p.Add(k, policy.status().message(), &n);
          }
        },
        SC_SAME(cache.eviction));
    add("cache.segment_size", false,
        [](const std::string& k, N n, Config& c, Problems& p) {
          if (auto v = ReadSize(n, k, p)) {
            if (*v < kMinSegmentBytes || *v % kDirectIoAlign != 0) {
              p.Add(k, FormatBytes(*v) + " must be at least " + FormatBytes(kMinSegmentBytes) +
                           " (two chunks of the default 4 MiB chunk size; a chunk larger than a "
                           "segment is never cached) and a multiple of 4 KiB", &n);
            } else {
              c.cache.segment_bytes = *v;
            }
          }
        },
        SC_SAME(cache.segment_bytes));
    add("fetch.bandwidth", true,
        [](const std::string& k, N n, Config& c, Problems& p) {
          if (auto v = ReadRate(n, k, p)) c.fetch.bandwidth_bytes_per_s = *v;
        },
        SC_SAME(fetch.bandwidth_bytes_per_s));
    add("fetch.connections", false,
        [](const std::string& k, N n, Config& c, Problems& p) {
          if (auto v = ReadCount(n, k, p, 1, upstream::kMaxMaxConnections)) c.fetch.connections = *v;
        },
        SC_SAME(fetch.connections));
    add("fetch.max_connections", false,
        [](const std::string& k, N n, Config& c, Problems& p) {
          if (auto v = ReadCount(n, k, p, 1, upstream::kMaxMaxConnections)) c.fetch.max_connections = *v;
        },
        SC_SAME(fetch.max_connections));
    add("fetch.timeout", false,
        [](const std::string& k, N n, Config& c, Problems& p) {
          if (auto d = ReadDuration(n, k, p)) c.fetch.timeout = *d;
        },
        SC_SAME(fetch.timeout));
    add("fetch.outage_timeout", false,
        [](const std::string& k, N n, Config& c, Problems& p) {
          if (auto d = ReadDuration(n, k, p)) c.fetch.outage_timeout = *d;
        },
        SC_SAME(fetch.outage_timeout));
    add("fetch.retries", false,
        [](const std::string& k, N n, Config& c, Problems& p) {
          if (auto v = ReadCount(n, k, p, 0, 100)) c.fetch.retries = *v;
        },
        SC_SAME(fetch.retries));
    add("fetch.max_in_flight", false,
        [](const std::string& k, N n, Config& c, Problems& p) {
          if (auto v = ReadSize(n, k, p)) c.fetch.max_in_flight_bytes = *v;
        },
        SC_SAME(fetch.max_in_flight_bytes));
    add("fetch.prefetch", true,
        [](const std::string& k, N n, Config& c, Problems& p) {
          if (auto v = ReadSize(n, k, p)) c.fetch.prefetch_bytes = *v;
        },
        SC_SAME(fetch.prefetch_bytes));
    for (auto [name, member] : {std::pair{"tls.cert", &Config::Tls::cert},
                                std::pair{"tls.key", &Config::Tls::key},
                                std::pair{"tls.ca", &Config::Tls::ca}}) {
      auto field = member;  // a copy: lambdas cannot capture structured bindings before C++20
      add(name, false,
          [field](const std::string& k, N n, Config& c, Problems& p) {
            if (auto v = ReadString(n, k, p)) c.tls.*field = *v;
          },
          [field](const Config& a, const Config& b) { return a.tls.*field == b.tls.*field; });
    }
    add("tls.require_client_cert", false,
        [](const std::string& k, N n, Config& c, Problems& p) {
          if (auto v = ReadBool(n, k, p)) c.tls.require_client_cert = *v;
        },
        SC_SAME(tls.require_client_cert));
    using ObjOpts = objstore::ObjectStoreOptions;
    for (auto [name, member] : {std::pair{"objstore.endpoint", &ObjOpts::endpoint},
                                std::pair{"objstore.region", &ObjOpts::region},
                                std::pair{"objstore.addressing", &ObjOpts::addressing},
                                std::pair{"objstore.credentials_file", &ObjOpts::credentials_file},
                                std::pair{"objstore.profile", &ObjOpts::profile},
                                std::pair{"objstore.ca", &ObjOpts::ca_file}}) {
      auto field = member;
      add(name, false,
          [field](const std::string& k, N n, Config& c, Problems& p) {
            auto v = ReadString(n, k, p);
            if (!v) return;
            ObjOpts probe;
            probe.*field = *v;
            // Validate() names the field; only these keys' own problems are reported here.
            if (Status bad = probe.Validate(); !bad.ok() && !v->empty()) p.Add(k, bad.message(), &n);
            else c.objstore.*field = *v;
          },
          [field](const Config& a, const Config& b) { return a.objstore.*field == b.objstore.*field; });
    }
    // Credentials: a problem never quotes their values.
    for (auto [name, member] : {std::pair{"objstore.access_key_id", &objstore::Credentials::access_key_id},
                                std::pair{"objstore.secret_access_key", &objstore::Credentials::secret_access_key},
                                std::pair{"objstore.session_token", &objstore::Credentials::session_token}}) {
      auto field = member;
      add(name, false,
          [field](const std::string& k, N n, Config& c, Problems& p) {
            if (auto v = ReadString(n, k, p)) c.objstore.credentials.*field = *v;
          },
          [field](const Config& a, const Config& b) {
            return a.objstore.credentials.*field == b.objstore.credentials.*field;
          });
    }
    add("objstore.verify_tls", false,
        [](const std::string& k, N n, Config& c, Problems& p) {
          if (auto v = ReadBool(n, k, p)) c.objstore.verify_tls = *v;
        },
        SC_SAME(objstore.verify_tls));
    for (auto [name, member] : {std::pair{"objstore.request_timeout", &ObjOpts::request_timeout_ms},
                                std::pair{"objstore.stall_timeout", &ObjOpts::stall_timeout_ms}}) {
      auto field = member;
      add(name, false,
          [field](const std::string& k, N n, Config& c, Problems& p) {
            auto d = ReadDuration(n, k, p);
            if (!d) return;
            if (d->count() < 1000 || d->count() > 24 * 3600 * 1000) p.Add(k, "must be between 1s and 24h", &n);
            else c.objstore.*field = static_cast<uint32_t>(d->count());
          },
          [field](const Config& a, const Config& b) { return a.objstore.*field == b.objstore.*field; });
    }
    add("objstore.max_connections", false,
        [](const std::string& k, N n, Config& c, Problems& p) {
          if (auto v = ReadCount(n, k, p, 1, 1024)) c.objstore.max_connections = *v;
        },
        SC_SAME(objstore.max_connections));
    add("objstore.attempts", false,
        [](const std::string& k, N n, Config& c, Problems& p) {
          if (auto v = ReadCount(n, k, p, 1, 100)) c.objstore.max_attempts = *v;
        },
        SC_SAME(objstore.max_attempts));
    add("auth.token", false,
        [](const std::string& k, N n, Config& c, Problems& p) {
          if (auto v = ReadString(n, k, p)) c.auth.token = *v;
        },
        SC_SAME(auth.token));
    add("auth.token_file", false,
        [](const std::string& k, N n, Config& c, Problems& p) {
          if (auto v = ReadString(n, k, p)) c.auth.token_file = *v;
        },
        SC_SAME(auth.token_file));
    add("peers.members", false,
        [](const std::string& k, N n, Config& c, Problems& p) {
          if (auto v = ReadAddressList(n, k, p)) c.peers.members = *v;
        },
        SC_SAME(peers.members));
    for (auto [name, member] : {std::pair{"peers.dns", &Config::Peers::dns}, std::pair{"peers.self", &Config::Peers::self}}) {
      auto field = member;
      add(name, false,
          [field](const std::string& k, N n, Config& c, Problems& p) {
            if (auto v = ReadString(n, k, p)) {
              if (Status bad = CheckHostPort(*v); !v->empty() && !bad.ok()) p.Add(k, bad.message(), &n);
              else c.peers.*field = *v;
            }
          },
          [field](const Config& a, const Config& b) { return a.peers.*field == b.peers.*field; });
    }
    add("peers.refresh", false,
        [](const std::string& k, N n, Config& c, Problems& p) {
          if (auto d = ReadDuration(n, k, p)) c.peers.refresh = *d;
        },
        SC_SAME(peers.refresh));
    add("peers.timeout", false,
        [](const std::string& k, N n, Config& c, Problems& p) {
          if (auto d = ReadDuration(n, k, p)) c.peers.timeout = *d;
        },
        SC_SAME(peers.timeout));
    add("checkpoints.root", false,
        [](const std::string& k, N n, Config& c, Problems& p) {
          if (auto v = ReadString(n, k, p)) {
            if (!v->empty() && (*v)[0] != '/') p.Add(k, Quote(*v) + " must be an absolute path", &n);
            else c.checkpoints.root = *v;
          }
        },
        SC_SAME(checkpoints.root));
    add("checkpoints.writers", false,
        [](const std::string& k, N n, Config& c, Problems& p) {
          if (auto v = ReadCheckpointWriters(n, k, p)) c.checkpoints.writers = *v;
        },
        SC_SAME(checkpoints.writers));
    add("checkpoints.dir", false,
        [](const std::string& k, N n, Config& c, Problems& p) {
          if (auto v = ReadString(n, k, p)) {
            if (!v->empty() && (*v)[0] != '/') p.Add(k, Quote(*v) + " must be an absolute path", &n);
            else c.checkpoints.dir = *v;
          }
        },
        SC_SAME(checkpoints.dir));
    add("checkpoints.upload_bandwidth", false,
        [](const std::string& k, N n, Config& c, Problems& p) {
          if (auto v = ReadSize(n, k, p)) c.checkpoints.upload_bandwidth_bytes_per_s = *v;
        },
        SC_SAME(checkpoints.upload_bandwidth_bytes_per_s));
    add("checkpoints.keep_local", false,
        [](const std::string& k, N n, Config& c, Problems& p) {
          if (auto v = ReadCount(n, k, p, 0, 1000000)) c.checkpoints.keep_local = *v;
        },
        SC_SAME(checkpoints.keep_local));
    add("log.level", true,
        [](const std::string& k, N n, Config& c, Problems& p) {
          if (auto v = ReadString(n, k, p)) {
            static const char* kLevels[] = {"trace", "debug", "info", "warn", "error", "critical", "off"};
            if (std::find(std::begin(kLevels), std::end(kLevels), *v) == std::end(kLevels)) {
              p.Add(k, Quote(*v) + " is not a log level (trace, debug, info, warn, error, critical, off)", &n);
            } else {
              c.log.level = *v;
            }
          }
        },
        SC_SAME(log.level));
    add("local.allowed_uids", false,
        [](const std::string& k, N n, Config& c, Problems& p) {
          if (auto v = ReadIdList(n, k, p)) c.local.allowed_uids = *v;
        },
        SC_SAME(local.allowed_uids));
    add("local.allowed_groups", false,
        [](const std::string& k, N n, Config& c, Problems& p) {
          if (auto v = ReadGroupNames(n, k, p)) c.local.allowed_groups = *v;
        },
        SC_SAME(local.allowed_groups));
    add("local.allowed_gids", false,
        [](const std::string& k, N n, Config& c, Problems& p) {
          if (auto v = ReadIdList(n, k, p)) c.local.allowed_gids = *v;
        },
        SC_SAME(local.allowed_gids));
    add("local.arena_size", false,
        [](const std::string& k, N n, Config& c, Problems& p) {
          if (auto v = ReadSize(n, k, p)) {
            if (*v < (1u << 20)) p.Add(k, FormatBytes(*v) + " is below the 1 MiB minimum", &n);
            else c.local.arena_size_bytes = *v;
          }
        },
        SC_SAME(local.arena_size_bytes));
    add("local.slots", false,
        [](const std::string& k, N n, Config& c, Problems& p) {
          if (auto v = ReadCount(n, k, p, 1, 4096)) c.local.slots = *v;
        },
        SC_SAME(local.slots));
    add("local.max_connections", false,
        [](const std::string& k, N n, Config& c, Problems& p) {
          if (auto v = ReadCount(n, k, p, 1, 65536)) c.local.max_connections = *v;
        },
        SC_SAME(local.max_connections));
    return s;
  }();
  return specs;
}

const KeySpec* FindSpec(const std::string& name) {
  for (const auto& s : Specs()) {
    if (s.name == name) return &s;
  }
  return nullptr;
}

bool IsSection(const std::string& name) {
  const std::string prefix = name + ".";
  for (const auto& s : Specs()) {
    if (s.name.compare(0, prefix.size(), prefix) == 0) return true;
  }
  return false;
}

void ReportUnknown(const std::string& name, const toml::node& n, Problems& p) {
  std::string best;
  size_t best_d = 3;
  for (const auto& s : Specs()) {
    const size_t d = EditDistance(name, s.name);
    if (d < best_d) {
      best_d = d;
      best = s.name;
    }
  }
  p.Add(name, best.empty() ? "unknown key" : "unknown key (did you mean '" + best + "'?)", &n);
}

void Walk(const toml::table& table, const std::string& prefix, Config& c, Problems& p) {
  for (const auto& [k, v] : table) {
    const std::string name = prefix.empty() ? std::string(k.str()) : prefix + "." + std::string(k.str());
    if (const KeySpec* spec = FindSpec(name)) {
      spec->read(v, c, p);
    } else if (IsSection(name)) {
      if (const toml::table* t = v.as_table()) {
        Walk(*t, name, c, p);
      } else {
        p.Add(name, "expected a table [" + name + "], got " + TypeName(v), &v);
      }
    } else {
      ReportUnknown(name, v, p);
    }
  }
}

std::string TrimRight(std::string s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.pop_back();
  return s;
}

// Rules that involve more than one key.
void CheckTogether(Config& c, bool upstream_seen, ReferencedFiles files, Problems& p) {
  if (!upstream_seen) {
    p.Add("upstream", "missing (required: file:///DIR, grpc://HOST:PORT, grpcs://HOST:PORT, s3://BUCKET/PREFIX or "
                      "https://HOST/PATH)");
  }
  if (c.fetch.connections > c.fetch.max_connections) {
    p.Add("fetch.connections", std::to_string(c.fetch.connections) + " exceeds fetch.max_connections (" +
                                   std::to_string(c.fetch.max_connections) + ")");
  }
  if (c.cache.size_bytes > 0 && c.cache.dir.empty()) {
    p.Add("cache.dir", "must be set when cache.size is not 0");
  }
  const objstore::Credentials& oc = c.objstore.credentials;
  if (!oc.access_key_id.empty() && oc.secret_access_key.empty()) {
    p.Add("objstore.secret_access_key", "must be set when objstore.access_key_id is set");
  }
  if (oc.access_key_id.empty() && (!oc.secret_access_key.empty() || !oc.session_token.empty())) {
    p.Add("objstore.access_key_id", "must be set when objstore.secret_access_key or session_token is set");
  }
  if (!c.tls.cert.empty() && c.tls.key.empty()) p.Add("tls.key", "must be set when tls.cert is set");
  if (c.tls.cert.empty() && !c.tls.key.empty()) p.Add("tls.cert", "must be set when tls.key is set");
  if (c.tls.require_client_cert && c.tls.ca.empty()) {
    p.Add("tls.require_client_cert", "needs tls.ca to verify client certificates against");
  }
  if (c.tls.require_client_cert && c.tls.cert.empty()) {
    p.Add("tls.require_client_cert", "needs tls.cert and tls.key (client certificates need a TLS server)");
  }
  for (auto [key, path] : {std::pair{"tls.cert", &c.tls.cert}, std::pair{"tls.key", &c.tls.key},
                           std::pair{"tls.ca", &c.tls.ca}}) {
    if (path->empty() || files == ReferencedFiles::kSkip) continue;
    if (auto r = ReadFileToString(*path); !r.ok()) p.Add(key, r.status().message());
  }
  if (!c.auth.token.empty() && !c.auth.token_file.empty()) {
    p.Add("auth.token", "set either auth.token or auth.token_file, not both");
  } else if (!c.auth.token_file.empty() && files == ReferencedFiles::kRead) {
    auto r = ReadFileToString(c.auth.token_file);
    if (!r.ok()) {
      p.Add("auth.token_file", r.status().message());
    } else {
      c.auth.token = TrimRight(*r);
      if (c.auth.token.empty()) p.Add("auth.token_file", Quote(c.auth.token_file) + " is empty");
    }
  }
  if (c.auth.token.find_first_of("\r\n") != std::string::npos) {
    p.Add("auth.token", "must be a single line");
  }
  if (!c.checkpoints.writers.empty() && c.checkpoints.root.empty()) {
    p.Add("checkpoints.writers", "needs checkpoints.root (where the writers' objects are committed)");
  }
  for (size_t i = 0; i < c.checkpoints.writers.size() && files == ReferencedFiles::kRead; ++i) {
    auto& w = c.checkpoints.writers[i];
    const std::string key = "checkpoints.writers[" + std::to_string(i) + "]";
    auto r = ReadFileToString(w.token_file);
    if (!r.ok()) {
      p.Add(key, r.status().message());
      continue;
    }
    w.token = TrimRight(*r);
    if (w.token.empty() || w.token.find_first_of("\r\n") != std::string::npos) {
      p.Add(key, Quote(w.token_file) + " must hold one non-empty line (the writer's token)");
    }
  }
}

}  // namespace

uint64_t BufferMemoryBytes(const Config& c) {
  const uint64_t arenas = c.listen.socket.empty() ? 0 : uint64_t{c.local.max_connections} * c.local.arena_size_bytes;
  return c.cache.memory_bytes + arenas;
}

Result<std::chrono::milliseconds> ParseDuration(const std::string& text) {
  size_t i = 0;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.')) ++i;
  const std::string num = text.substr(0, i), unit = text.substr(i);
  char* end = nullptr;
  const double v = std::strtod(num.c_str(), &end);
  double ms_per = 0;
  if (unit.empty() || unit == "s") ms_per = 1000;
  else if (unit == "ms") ms_per = 1;
  else if (unit == "m" || unit == "min") ms_per = 60e3;
  else if (unit == "h") ms_per = 3600e3;
  if (num.empty() || end != num.c_str() + num.size() || ms_per == 0 || !std::isfinite(v) ||
      v * ms_per > 1e12) {
    return InvalidArgument(Quote(text) + " is not a duration (examples: 500ms, 30s, 2m, 1h)");
  }
  return std::chrono::milliseconds(static_cast<int64_t>(std::llround(v * ms_per)));
}

Result<Config> ParseConfig(const std::string& text, const std::string& where, ReferencedFiles files) {
  toml::table root;
  try {
    root = toml::parse(text, where);
  } catch (const toml::parse_error& e) {
    Problems p;
    p.AddRaw("line " + std::to_string(e.source().begin.line) + ", column " +
             std::to_string(e.source().begin.column) + ": " + std::string(e.description()));
    return p.ToStatus(where);
  }
  Config c;
  Problems p;
  Walk(root, "", c, p);
  CheckTogether(c, root.contains("upstream"), files, p);
  if (!p.empty()) return p.ToStatus(where);
  return c;
}

Result<Config> LoadConfig(const std::string& path, ReferencedFiles files) {
  SC_ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
  return ParseConfig(text, path, files);
}

const std::vector<KeyInfo>& KnownKeys() {
  static const std::vector<KeyInfo> keys = [] {
    std::vector<KeyInfo> out;
    for (const auto& s : Specs()) out.push_back({s.name, s.reloadable});
    return out;
  }();
  return keys;
}

ConfigDiff ReloadableDiff(const Config& running, const Config& loaded) {
  ConfigDiff d;
  for (const auto& s : Specs()) {
    if (s.same(running, loaded)) continue;
    (s.reloadable ? d.reloadable : d.not_reloadable).push_back(s.name);
  }
  return d;
}

}  // namespace shardcache::config
