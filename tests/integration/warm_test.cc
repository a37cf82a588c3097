// `shardctl warm --socket` against a real shardcached: the node daemon (file upstream, NVMe
// cache tier, local socket, Origin port) is asked over its local socket to warm a dataset. The
// test checks what an operator relies on: afterwards every chunk is in the NVMe tier and reading
// the dataset again fetches nothing upstream; the goodput line and --json report the split
// between fetched and already-cached bytes; an unknown dataset, a corrupt shard upstream, a
// missing socket and a stale socket each end with exit code 1 and a message naming the cause.
//
// Programs come from $SHARDCACHE_BIN_DIR when set, else from this build's bin/.
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <sstream>
#include <thread>

#include <catch2/catch.hpp>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include "common/fs.h"
#include "testing/datasets.h"
#include "testing/process.h"
#include "integration/daemon_probe.h"
#include "testing/temp_dir.h"

namespace shardcache::testing {
namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;

nlohmann::json Status(int metrics_port) {
  httplib::Client cli("127.0.0.1", metrics_port);
  cli.set_read_timeout(10s);
  auto res = cli.Get("/status");
  if (!res || res->status != 200) return nlohmann::json::object();
  auto j = nlohmann::json::parse(res->body, nullptr, false);
  return j.is_object() ? j : nlohmann::json::object();
}

uint64_t NvmeEntries(const nlohmann::json& st) {
  if (!st.is_object() || !st.contains("tiers")) return 0;
  for (const auto& t : st["tiers"]) {
    if (t["name"] == "nvme") return t["entries"].get<uint64_t>();
  }
  return 0;
}

bool WaitFor(const std::function<bool()>& pred, std::chrono::milliseconds timeout = 20s) {
  const auto end = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < end) {
    if (pred()) return true;
    std::this_thread::sleep_for(20ms);
  }
  return pred();
}

// The last line of `out` that parses as a JSON object.
nlohmann::json LastJsonLine(const std::string& out) {
  nlohmann::json found;
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] != '{') continue;
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (!j.is_discarded()) found = j;
  }
  return found;
}

constexpr int kShards = 3;
constexpr uint64_t kRecords = 64, kRecordBytes = 4096, kChunkBytes = 16 << 10;
constexpr uint64_t kDatasetBytes = kShards * kRecords * kRecordBytes;  // 768 KiB
constexpr uint64_t kChunks = kDatasetBytes / kChunkBytes;               // 48

// A node daemon over a file upstream holding "tokens" (good) and "broken" (shard 1 corrupted
// after indexing: same size, one flipped byte, so only reading its chunks finds it).
struct Node {
  TempDir dir;
  std::string root = dir / "datasets";
  std::string socket = dir / "run/shardcached.sock";
  std::string log = dir / "node.log";
  int metrics_port = FreePort();
  int origin_port = FreePort();
  std::unique_ptr<Process> proc;

  Node() {
    REQUIRE(MakeDirs(root).ok());
    REQUIRE(MakeRecordsDataset(root, "tokens", kShards, kRecords, kRecordBytes, kChunkBytes).ok());
    REQUIRE(MakeRecordsDataset(root, "broken", kShards, kRecords, kRecordBytes, kChunkBytes, 7).ok());
    {
      std::fstream f(root + "/broken/shard-00001.bin", std::ios::in | std::ios::out | std::ios::binary);
      REQUIRE(f.good());
      f.seekg(5000);
      char c = 0;
      f.read(&c, 1);
      c = static_cast<char>(c ^ 0x5a);
      f.seekp(5000);
      f.write(&c, 1);
    }
    const std::string config = dir / "node.toml";
    REQUIRE(WriteFileAtomic(config,
                            "upstream = \"file://" + root + "\"\n[listen]\norigin = \"127.0.0.1:" +
                                std::to_string(origin_port) + "\"\nsocket = \"" + socket +
                                "\"\nmetrics = \"127.0.0.1:" + std::to_string(metrics_port) +
                                "\"\n[cache]\ndir = \"" + (dir / "cache") +
                                "\"\nsize = \"64MiB\"\nsegment_size = \"8MiB\"\nmemory_size = \"0\"\n"
                                "min_free = \"1%\"\n[log]\nlevel = \"info\"\n")
                .ok());
    proc = std::make_unique<Process>(std::vector<std::string>{Bin("shardcached"), "--config", config}, log);
    REQUIRE(WaitFor([&] {
      REQUIRE(proc->Running());
      return Status(metrics_port).value("health", "") == "ok" && fs::exists(socket);
    }, 30s));
  }

  int Warm(const std::string& args, std::string* out) {
    out->clear();
    return RunCommand(Bin("shardctl") + " warm " + args + " 2>&1", out);
  }
};

TEST_CASE("shardctl warm --socket fills the running daemon's cache; reading again fetches nothing upstream",
          "[integration][warm]") {
  Node node;
  INFO("node log:\n" << LogTail(node.log));
  const std::string fetched_chunks = "shardcache_cache_upstream_fetched_chunks_total";
  REQUIRE(NvmeEntries(Status(node.metrics_port)) == 0);

  std::string out;
  REQUIRE(node.Warm("--socket " + node.socket + " --json tokens", &out) == 0);
  INFO(out);
  CHECK(out.find("warmed 'tokens' (version ") != std::string::npos);
  CHECK(out.find("MB/s") != std::string::npos);
  CHECK(out.find("Mbit/s") != std::string::npos);
  auto j = LastJsonLine(out);
  REQUIRE(j.is_object());
  CHECK(j["dataset"] == "tokens");
  CHECK(j["bytes"] == kDatasetBytes);
  CHECK(j["chunks"] == kChunks);
  CHECK(j["upstream_bytes"] == kDatasetBytes);  // a cold cache: everything came from upstream
  CHECK(j["cached_bytes"] == 0);
  CHECK(j["already_running"] == false);
  CHECK(j["seconds"].get<double>() > 0);

  // Every chunk is stored on NVMe (the writer may trail the warm's end by a moment), and each was
  // fetched exactly once.
  CHECK(WaitFor([&] { return NvmeEntries(Status(node.metrics_port)) == kChunks; }));
  CHECK(Metric(node.metrics_port, fetched_chunks) == kChunks);

  // A second warm finds everything cached.
  REQUIRE(node.Warm("--socket " + node.socket + " --json tokens", &out) == 0);
  j = LastJsonLine(out);
  REQUIRE(j.is_object());
  CHECK(j["bytes"] == kDatasetBytes);
  CHECK(j["upstream_bytes"] == 0);
  CHECK(j["cached_bytes"] == kDatasetBytes);
  CHECK(out.find("from upstream 0 B") != std::string::npos);

  // A trainer-like read of the whole dataset through the node: byte-exact, served from the cache,
  // not one more upstream fetch.
  const double hits_before = Metric(node.metrics_port, "shardcache_cache_hits_total");
  std::string fout;
  REQUIRE(RunCommand(Bin("shardctl") + " fetch --timeout 60 --upstream grpc://127.0.0.1:" +
                         std::to_string(node.origin_port) + " tokens all " + (node.dir / "out") + " 2>&1",
                     &fout) == 0);
  INFO(fout);
  for (int s = 0; s < kShards; ++s) {
    char name[32];
    std::snprintf(name, sizeof(name), "shard-%05d.bin", s);
    auto want = ReadFileToString(node.root + "/tokens/" + name);
    auto got = ReadFileToString(node.dir / ("out/" + std::string(name)));
    REQUIRE(want.ok());
    REQUIRE(got.ok());
    REQUIRE(*got == *want);
  }
  CHECK(Metric(node.metrics_port, fetched_chunks) == kChunks);
  CHECK(Metric(node.metrics_port, "shardcache_cache_hits_total") - hits_before == kChunks);

  node.proc->Signal(SIGTERM);
  CHECK(node.proc->Wait(30s) == 0);
}

TEST_CASE("shardctl warm --socket names the dataset and what failed", "[integration][warm]") {
  Node node;
  INFO("node log:\n" << LogTail(node.log));
  std::string out;

  SECTION("an unknown dataset") {
    CHECK(node.Warm("--socket " + node.socket + " no-such-set", &out) == 1);
    INFO(out);
    CHECK(out.find("warming dataset 'no-such-set'") != std::string::npos);
    CHECK(out.find("NotFound") != std::string::npos);
  }
  SECTION("a shard that fails verification upstream") {
    CHECK(node.Warm("--socket " + node.socket + " broken", &out) == 1);
    INFO(out);
    CHECK(out.find("warming dataset 'broken'") != std::string::npos);
    CHECK(out.find("shard 1 ('shard-00001.bin')") != std::string::npos);
    CHECK(out.find("DataLoss") != std::string::npos);
    // The daemon itself is fine and still warms the good dataset.
    CHECK(node.Warm("--socket " + node.socket + " tokens", &out) == 0);
  }
  SECTION("no socket at the path") {
    CHECK(node.Warm("--socket " + (node.dir / "nowhere.sock") + " tokens", &out) == 1);
    INFO(out);
    CHECK(out.find("no shardcached socket at " + (node.dir / "nowhere.sock")) != std::string::npos);
    CHECK(out.find("'tokens'") != std::string::npos);
  }
  SECTION("a stale socket nobody listens on") {
    const std::string stale = node.dir / "stale.sock";
    {
      UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM, 0));
      sockaddr_un addr{};
      addr.sun_family = AF_UNIX;
      std::strncpy(addr.sun_path, stale.c_str(), sizeof(addr.sun_path) - 1);
      REQUIRE(::bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
    }  // closed without unlink: what a crashed daemon leaves
    CHECK(node.Warm("--socket " + stale + " tokens", &out) == 1);
    INFO(out);
    CHECK(out.find("nobody is listening on " + stale) != std::string::npos);
  }
  SECTION("--socket with --upstream is a usage error") {
    CHECK(node.Warm("--socket " + node.socket + " --upstream file://" + node.root + " tokens", &out) == 2);
    CHECK(out.find("does not combine") != std::string::npos);
  }
}

}  // namespace
}  // namespace shardcache::testing
