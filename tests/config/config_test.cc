#include "config/config.h"

#include <fstream>
#include <regex>
#include <set>

#include <catch2/catch.hpp>

#include "common/fs.h"
#include "testing/temp_dir.h"

namespace shardcache::config {
namespace {

std::string ExamplePath() { return std::string(SC_SOURCE_DIR) + "/config/shardcached.toml"; }

// Lines of the error message after the "where: N problems" header.
std::vector<std::string> ProblemLines(const Status& s) {
  std::vector<std::string> out;
  std::istringstream in(s.message());
  std::string line;
  std::getline(in, line);
  while (std::getline(in, line)) out.push_back(line);
  return out;
}

TEST_CASE("a minimal config takes every default", "[config]") {
  auto c = ParseConfig("upstream = \"file:///srv/datasets\"\n");
  REQUIRE(c.ok());
  CHECK(c->upstream == "file:///srv/datasets");
  CHECK(c->listen.socket == "/run/shardcache/shardcached.sock");
  CHECK(c->listen.metrics == "127.0.0.1:9750");
  CHECK(c->listen.origin.empty());
  CHECK(c->cache.size_bytes == 0);
  CHECK(c->cache.min_free.fraction == 0.05);
  CHECK(c->fetch.timeout == std::chrono::seconds(60));
  CHECK(c->log.level == "info");
}

TEST_CASE("the design's example keys parse to the values they name", "[config]") {
  auto c = ParseConfig(R"(
upstream = "grpc://origin.example:7443"
[listen]
origin  = "0.0.0.0:7443"
socket  = "/run/shardcache/shardcached.sock"
metrics = "127.0.0.1:9750"
[cache]
dir = "/var/cache/shardcache"
size = "800GiB"
memory_size = "8GiB"
min_free = "5%"
eviction = "clairvoyant"
[fetch]
bandwidth = "10Gbit"
timeout = "1500ms"
prefetch = 1048576
)");
  REQUIRE(c.ok());
  CHECK(c->cache.size_bytes == 800ull << 30);
  CHECK(c->cache.memory_bytes == 8ull << 30);
  CHECK(c->cache.eviction == cache::EvictionPolicyKind::kClairvoyant);
  CHECK(c->fetch.bandwidth_bytes_per_s == 1250000000ull);
  CHECK(c->fetch.timeout == std::chrono::milliseconds(1500));
  CHECK(c->fetch.prefetch_bytes == 1048576);
  CHECK(c->cache.min_free.BytesFor(1000) == 50);
}

TEST_CASE("[objstore] keys set the object-storage options; problems never quote a secret", "[config]") {
  auto c = ParseConfig(R"(
upstream = "s3://bucket/datasets"
[objstore]
endpoint = "http://127.0.0.1:9000"
region = "eu-west-3"
addressing = "path"
access_key_id = "AKIAEXAMPLE"
secret_access_key = "s3cr3t/Value+"
ca = "/etc/ssl/ca.pem"
request_timeout = "90s"
stall_timeout = "5s"
max_connections = 128
attempts = 3
)");
  REQUIRE(c.ok());
  CHECK(c->objstore.endpoint == "http://127.0.0.1:9000");
  CHECK(c->objstore.region == "eu-west-3");
  CHECK(c->objstore.addressing == "path");
  CHECK(c->objstore.credentials.access_key_id == "AKIAEXAMPLE");
  CHECK(c->objstore.credentials.secret_access_key == "s3cr3t/Value+");
  CHECK(c->objstore.ca_file == "/etc/ssl/ca.pem");
  CHECK(c->objstore.request_timeout_ms == 90000);
  CHECK(c->objstore.stall_timeout_ms == 5000);
  CHECK(c->objstore.max_connections == 128);
  CHECK(c->objstore.max_attempts == 3);
  auto bad = ParseConfig(R"(
upstream = "s3://bucket"
[objstore]
endpoint = "minio:9000"
addressing = "dns"
secret_access_key = "s3cr3t/Value+"
max_connections = 0
)");
  REQUIRE_FALSE(bad.ok());
  const std::string m = bad.status().message();
  INFO(m);
  CHECK_THAT(m, Catch::Contains("objstore.endpoint: endpoint 'minio:9000' must start with http:// or https://"));
  CHECK_THAT(m, Catch::Contains("objstore.addressing: addressing 'dns' must be auto, path or virtual"));
  CHECK_THAT(m, Catch::Contains("objstore.access_key_id: must be set when objstore.secret_access_key"));
  CHECK_THAT(m, Catch::Contains("objstore.max_connections"));
  CHECK_THAT(m, !Catch::Contains("s3cr3t"));
}

TEST_CASE("min_free accepts a size as well as a percentage", "[config]") {
  auto c = ParseConfig("upstream = \"file:///d\"\n[cache]\nmin_free = \"50GiB\"\n");
  REQUIRE(c.ok());
  CHECK(c->cache.min_free.bytes == 50ull << 30);
  CHECK(c->cache.min_free.BytesFor(1ull << 40) == 50ull << 30);
}

TEST_CASE("unknown keys and bad values are all reported at once, each naming its key", "[config]") {
  auto c = ParseConfig(R"(
upstream = "ftp://origin:80"
colour = "blue"
[listen]
metrics = "localhost"
socket = "relative.sock"
[cache]
size = "12 parsecs"
sise = "1GiB"
min_free = "120%"
eviction = "fifo"
segment_size = "1000"
[fetch]
bandwidth = "fast"
connections = 0
timeout = "soon"
[log]
level = "loud"
[local]
allowed_uids = [1000, "bob"]
[gpu]
enabled = true
)", "test.toml");
  REQUIRE_FALSE(c.ok());
  const auto lines = ProblemLines(c.status());
  INFO(c.status().message());
  CHECK(c.status().message().rfind("test.toml: 15 problems", 0) == 0);
  const std::vector<std::string> expected = {
      "upstream: 'ftp://origin:80' is not a supported upstream",
      "colour: unknown key",
      "listen.metrics: 'localhost' is not host:port",
      "listen.socket: 'relative.sock' is not an absolute path",
      "cache.size: '12 parsecs' has an unknown size unit 'parsecs'",
      "cache.sise: unknown key (did you mean 'cache.size'?)",
      "cache.min_free: '120%' is not a percentage",
      "cache.eviction: 'fifo' is not an eviction policy",
      "cache.segment_size: 1000 B must be at least 8.00 MiB",
      "fetch.bandwidth: 'fast' is not a rate",
      "fetch.connections: 0 is out of range [1, 1024]",
      "fetch.timeout: 'soon' is not a duration",
      "log.level: 'loud' is not a log level",
      "local.allowed_uids[1]: expected an integer, got a string",
      "gpu: unknown key",
  };
  REQUIRE(lines.size() == expected.size());
  for (const auto& e : expected) {
    bool found = false;
    for (const auto& l : lines) found = found || l.find(e) != std::string::npos;
    INFO("expected a line containing: " << e);
    CHECK(found);
  }
  // Each problem points at its line in the file.
  CHECK(c.status().message().find("cache.size: '12 parsecs' has an unknown size unit 'parsecs' ("
                                  "use B, KiB, MiB, GiB, TiB, KB, MB, GB, TB) (line 8)") !=
        std::string::npos);
}

TEST_CASE("a segment_size that holds fewer than two default 4 MiB chunks is refused, naming why", "[config]") {
  // The old rule (at least 1 MiB) accepted 4 MiB: every default-sized chunk then has a 4 KiB
  // block table on top and did not fit, so the NVMe tier silently stored nothing.
  for (const char* size : {"4MiB", "4100KiB", "1MiB"}) {
    auto c = ParseConfig(std::string("upstream = \"file:///d\"\n[cache]\nsegment_size = \"") + size + "\"\n");
    INFO(size);
    REQUIRE_FALSE(c.ok());
    CHECK(c.status().message().find("cache.segment_size: ") != std::string::npos);
    CHECK(c.status().message().find("must be at least 8.00 MiB (two chunks of the default 4 MiB chunk size") !=
          std::string::npos);
  }
  auto ok = ParseConfig("upstream = \"file:///d\"\n[cache]\nsegment_size = \"8MiB\"\n");
  REQUIRE(ok.ok());
  CHECK(ok->cache.segment_bytes == 8ull << 20);
}

TEST_CASE("require_mount and outage_timeout parse, with their defaults off and 30 s", "[config]") {
  auto d = ParseConfig("upstream = \"file:///d\"\n");
  REQUIRE(d.ok());
  CHECK_FALSE(d->cache.require_mount);
  CHECK(d->fetch.outage_timeout == std::chrono::seconds(30));
  auto c = ParseConfig("upstream = \"file:///d\"\n[cache]\nrequire_mount = true\n[fetch]\noutage_timeout = \"5s\"\n");
  REQUIRE(c.ok());
  CHECK(c->cache.require_mount);
  CHECK(c->fetch.outage_timeout == std::chrono::seconds(5));
  auto bad = ParseConfig("upstream = \"file:///d\"\n[cache]\nrequire_mount = \"yes\"\n[fetch]\noutage_timeout = \"0s\"\n");
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.status().message().find("cache.require_mount: expected true or false") != std::string::npos);
  CHECK(bad.status().message().find("fetch.outage_timeout: must be greater than zero") != std::string::npos);
}

TEST_CASE("a missing upstream and inconsistent keys are reported", "[config]") {
  auto c = ParseConfig(R"(
[fetch]
connections = 20
max_connections = 8
[tls]
require_client_cert = true
[auth]
token = "a"
token_file = "/nonexistent"
)");
  REQUIRE_FALSE(c.ok());
  const std::string m = c.status().message();
  INFO(m);
  CHECK(m.find("upstream: missing") != std::string::npos);
  CHECK(m.find("fetch.connections: 20 exceeds fetch.max_connections (8)") != std::string::npos);
  CHECK(m.find("tls.require_client_cert: needs tls.ca") != std::string::npos);
  CHECK(m.find("auth.token: set either auth.token or auth.token_file, not both") != std::string::npos);
}

TEST_CASE("trainers are allowed by group name, the package's trainer group by default", "[config]") {
  auto d = ParseConfig("upstream = \"file:///d\"\n");
  REQUIRE(d.ok());
  CHECK(d->local.allowed_groups == std::vector<std::string>{"shardcache-users"});
  auto c = ParseConfig("upstream = \"file:///d\"\n[local]\nallowed_groups = [\"ml\", \"video-team\"]\n");
  REQUIRE(c.ok());
  CHECK(c->local.allowed_groups == std::vector<std::string>{"ml", "video-team"});
  auto bad = ParseConfig("upstream = \"file:///d\"\n[local]\nallowed_groups = [\"a:b\", 7]\n");
  REQUIRE_FALSE(bad.ok());
  INFO(bad.status().message());
  CHECK(bad.status().message().find("local.allowed_groups[0]: 'a:b' is not a group name") != std::string::npos);
  CHECK(bad.status().message().find("local.allowed_groups[1]: expected a string, got an integer") != std::string::npos);
}

TEST_CASE("buffer memory is the DRAM tier plus an arena per allowed connection, none without a socket",
          "[config]") {
  auto c = ParseConfig(R"(
upstream = "file:///d"
[cache]
memory_size = "8GiB"
[local]
arena_size = "256MiB"
max_connections = 48
)");
  REQUIRE(c.ok());
  CHECK(BufferMemoryBytes(*c) == (8ull << 30) + 48 * (256ull << 20));
  c->listen.socket.clear();
  CHECK(BufferMemoryBytes(*c) == 8ull << 30);
  CHECK_FALSE(ParseConfig("upstream = \"file:///d\"\n[local]\nmax_connections = 0\n").ok());
}

TEST_CASE("a TOML syntax error names the line", "[config]") {
  auto c = ParseConfig("upstream = \"file:///d\"\n[cache\nsize = 1\n", "broken.toml");
  REQUIRE_FALSE(c.ok());
  INFO(c.status().message());
  CHECK(c.status().message().find("broken.toml: 1 problem\n  line 2") == 0);
}

TEST_CASE("a value of the wrong TOML type names the expected type", "[config]") {
  auto c = ParseConfig("upstream = 7\n[listen]\norigin = 7443\n[cache]\nsize = -1\n[tls]\nrequire_client_cert = \"yes\"\n");
  REQUIRE_FALSE(c.ok());
  const std::string m = c.status().message();
  INFO(m);
  CHECK(m.find("upstream: expected a string, got an integer") != std::string::npos);
  CHECK(m.find("listen.origin: expected a string, got an integer") != std::string::npos);
  CHECK(m.find("cache.size: -1 is negative") != std::string::npos);
  CHECK(m.find("tls.require_client_cert: expected true or false, got a string") != std::string::npos);
}

TEST_CASE("auth.token_file is read and its trailing newline dropped", "[config]") {
  testing::TempDir dir;
  REQUIRE(WriteFileAtomic(dir / "token", "s3cret\n").ok());
  auto c = ParseConfig("upstream = \"file:///d\"\n[auth]\ntoken_file = \"" + (dir / "token") + "\"\n");
  REQUIRE(c.ok());
  CHECK(c->auth.token == "s3cret");
  REQUIRE(WriteFileAtomic(dir / "empty", "\n").ok());
  auto e = ParseConfig("upstream = \"file:///d\"\n[auth]\ntoken_file = \"" + (dir / "empty") + "\"\n");
  REQUIRE_FALSE(e.ok());
  CHECK(e.status().message().find("auth.token_file: '" + (dir / "empty") + "' is empty") != std::string::npos);
}

TEST_CASE("the documented example file parses to the built-in defaults", "[config]") {
  auto c = LoadConfig(ExamplePath());
  REQUIRE(c.ok());
  Config defaults;
  defaults.upstream = c->upstream;
  CHECK(*c == defaults);
}

TEST_CASE("the documented example file documents every key and its reload behaviour", "[config]") {
  auto text = ReadFileToString(ExamplePath());
  REQUIRE(text.ok());
  // Walk the file: "[section]" lines set the prefix; "key = value" lines are keys; the comment
  // block above a key must say [reload] or [restart], matching KnownKeys().
  std::map<std::string, std::string> documented;  // key -> "reload" | "restart"
  std::istringstream in(*text);
  std::string line, section, comments, last_mode;
  const std::regex kSection(R"(^\[(\w+)\]\s*(#.*)?$)"), kKey(R"(^(\w+)\s*=)");
  std::smatch m;
  while (std::getline(in, line)) {
    if (std::regex_match(line, m, kSection)) {
      section = m[1];
      comments.clear();
    } else if (line.rfind('#', 0) == 0) {
      comments += line;
    } else if (line.empty()) {
      comments.clear();
    } else if (std::regex_search(line, m, kKey)) {
      const std::string key = section.empty() ? std::string(m[1]) : section + "." + std::string(m[1]);
      std::string mode = comments.find("[reload]") != std::string::npos ? "reload"
                         : comments.find("[restart]") != std::string::npos ? "restart" : "";
      // allowed_uids/allowed_gids share one comment block.
      if (mode.empty()) mode = last_mode;
      documented[key] = last_mode = mode;
      comments.clear();
    }
  }
  for (const auto& k : KnownKeys()) {
    INFO("key " << k.name);
    REQUIRE(documented.count(k.name) == 1);
    CHECK(documented[k.name] == (k.reloadable ? "reload" : "restart"));
  }
  CHECK(documented.size() == KnownKeys().size());
}

TEST_CASE("reload diff separates keys SIGHUP applies from those needing a restart", "[config]") {
  auto a = ParseConfig("upstream = \"file:///d\"\n");
  REQUIRE(a.ok());
  CHECK(ReloadableDiff(*a, *a).empty());
  auto b = ParseConfig(R"(
upstream = "grpc://other:1"
[cache]
size = "1GiB"
eviction = "static"
[fetch]
bandwidth = "1Gbit"
prefetch = "2GiB"
[log]
level = "debug"
)");
  REQUIRE(b.ok());
  const auto d = ReloadableDiff(*a, *b);
  CHECK(std::set<std::string>(d.reloadable.begin(), d.reloadable.end()) ==
        std::set<std::string>{"cache.size", "fetch.bandwidth", "fetch.prefetch", "log.level"});
  CHECK(std::set<std::string>(d.not_reloadable.begin(), d.not_reloadable.end()) ==
        std::set<std::string>{"upstream", "cache.eviction"});
}

TEST_CASE("durations accept ms, s, m, h and plain seconds", "[config]") {
  CHECK(*ParseDuration("250ms") == std::chrono::milliseconds(250));
  CHECK(*ParseDuration("2m") == std::chrono::minutes(2));
  CHECK(*ParseDuration("1.5s") == std::chrono::milliseconds(1500));
  CHECK(*ParseDuration("10") == std::chrono::seconds(10));
  CHECK_FALSE(ParseDuration("").ok());
  CHECK_FALSE(ParseDuration("5 fortnights").ok());
  CHECK_FALSE(ParseDuration("-1s").ok());
}

}  // namespace
}  // namespace shardcache::config
