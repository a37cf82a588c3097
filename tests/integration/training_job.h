// A 2-rank training job against real daemons, shared by the restart and link-fault tests: an
// origin shardcached serving a records dataset, optionally ../shared/tools/wanem.py between it
// and a node shardcached, and trainers on the C++ client that check every sample's bytes and
// record the order they were served in.
#pragma once

#include <catch2/catch.hpp>

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "integration/daemons.h"
#include "shardcache/client.h"
#include "testing/datasets.h"
#include "testing/eventually.h"

namespace shardcache::testing {

// One rank's view of the epoch.
struct Rank {
  std::vector<uint64_t> ids;  // in the order Next() returned them
  std::atomic<uint64_t> batches{0};
  Status error;
};

// Rank r of 2 of the job's epoch of dataset "rec".
inline LoaderOptions JobRank(uint32_t r) {
  LoaderOptions o;
  o.dataset = "rec";
  o.batch_size = 8;
  o.seed = 3;
  o.shuffle = Shuffle::kGlobal;
  o.rank = r;
  o.world_size = 2;
  return o;
}

// Reads one epoch of rank `r` of 2, checking every sample's bytes (records dataset with
// `per_shard` records of `record_bytes`), resting `rest` between batches.
inline void ReadEpoch(const std::string& socket, uint32_t r, uint64_t per_shard, uint64_t record_bytes,
                      Rank* out, std::chrono::milliseconds rest = std::chrono::milliseconds(8)) {
  auto client = Client::Connect(socket);
  if (!client.ok()) {
    out->error = client.status();
    return;
  }
  auto loader = (*client)->OpenLoader(JobRank(r));
  if (!loader.ok()) {
    out->error = loader.status();
    return;
  }
  for (;;) {
    auto b = (*loader)->Next();
    if (!b.ok()) {
      if (b.status().code() != StatusCode::kOutOfRange) out->error = b.status();
      return;
    }
    for (size_t i = 0; i < b->size(); ++i) {
      const uint64_t id = b->sample_id(i);
      const std::string want = RecordBytes(1, static_cast<uint32_t>(id / per_shard), id % per_shard, record_bytes);
      if (std::string(reinterpret_cast<const char*>(b->sample(i).data), b->sample(i).size) != want) {
        out->error = DataLoss("sample " + std::to_string(id) + " has wrong bytes");
        return;
      }
      out->ids.push_back(id);
    }
    ++out->batches;
    if (rest.count() > 0) std::this_thread::sleep_for(rest);
  }
}

// The rank's order as one uninterrupted loader on `socket` reads it.
inline std::vector<uint64_t> PlanOrder(const std::string& socket, uint32_t r) {
  auto client = Client::Connect(socket);
  REQUIRE(client.ok());
  auto loader = (*client)->OpenLoader(JobRank(r));
  REQUIRE(loader.ok());
  std::vector<uint64_t> ids;
  while (auto b = (*loader)->Next()) {
    for (size_t i = 0; i < b->size(); ++i) ids.push_back(b->sample_id(i));
  }
  return ids;
}

// Origin + (wanem) + node, dataset "rec" of `shards` x `per_shard` records in 256 KiB chunks.
struct JobRig {
  TempDir dir;
  std::string root = dir / "data";
  uint64_t shards, per_shard, record_bytes;
  std::unique_ptr<Daemon> origin, node;
  std::unique_ptr<Process> wanem;  // between them, when wanem_args are given
  int wanem_port = FreePort();

  // (Re)starts the link emulator on wanem_port with `args`.
  void StartWanem(const std::vector<std::string>& args) {
    if (wanem) wanem->Kill();
    ::unlink((dir / "wanem.ready").c_str());
    std::vector<std::string> argv = {"/usr/bin/python3", WanemPath(), "--listen",
                                     "127.0.0.1:" + std::to_string(wanem_port), "--upstream",
                                     "127.0.0.1:" + std::to_string(origin->origin_port), "--ready-file",
                                     dir / "wanem.ready", "--stats-file", dir / "wanem.json"};
    argv.insert(argv.end(), args.begin(), args.end());
    wanem = std::make_unique<Process>(argv, dir / "wanem.log");
    REQUIRE(WaitForFile(dir / "wanem.ready"));
  }

  JobRig(uint64_t shard_count, uint64_t records_per_shard, uint64_t record,
         const std::vector<std::string>& wanem_args = {}, const std::string& node_toml = "")
      : shards(shard_count), per_shard(records_per_shard), record_bytes(record) {
    REQUIRE(MakeDirs(root).ok());
    REQUIRE(MakeRecordsDataset(root, "rec", shards, per_shard, record_bytes, 256 * 1024).ok());
    origin = std::make_unique<Daemon>(dir, "origin", "file://" + root, 0);
    origin->Start();
    std::string upstream = origin->Url();
    if (!wanem_args.empty()) {
      StartWanem(wanem_args);
      upstream = "grpc://127.0.0.1:" + std::to_string(wanem_port);
    }
    node = std::make_unique<Daemon>(dir, "node", upstream, 512 << 20, 8 << 20, dir / "node.sock", node_toml);
    node->Start();
  }

  uint64_t samples() const { return shards * per_shard; }

  // One of wanem's counters ("resets", "stalls", "refused", "bytes_down", ...), as it writes
  // them to its stats file on SIGUSR2.
  uint64_t WanemCounter(const std::string& key) {
    const std::string path = dir / "wanem.json";
    ::unlink(path.c_str());
    wanem->Signal(SIGUSR2);
    REQUIRE(WaitForFile(path));
    std::string text;
    REQUIRE(Eventually([&] {
      auto r = ReadFileToString(path);
      text = r.ok() ? *r : "";
      return text.find('}') != std::string::npos;
    }, std::chrono::seconds(5)));
    const size_t at = text.find("\"" + key + "\":");
    if (at == std::string::npos) return 0;
    return std::stoull(text.substr(at + key.size() + 3));
  }

  // A thread reading rank r's epoch into *out.
  std::thread Reader(uint32_t r, Rank* out, std::chrono::milliseconds rest = std::chrono::milliseconds(8)) {
    return std::thread(ReadEpoch, node->socket, r, per_shard, record_bytes, out, rest);
  }
};

// Waits until both ranks read `more` batches beyond what they had.
inline void WaitForProgress(Rank* ranks, uint64_t more) {
  const uint64_t a = ranks[0].batches, b = ranks[1].batches;
  REQUIRE(Eventually([&] { return ranks[0].batches >= a + more && ranks[1].batches >= b + more; },
                     std::chrono::seconds(60)));
}

}  // namespace shardcache::testing
