// sc_trainer_bench: a trainer stand-in for benchmarks and the demo. Reads epochs through
// libshardcache, optionally "computing" (sleeping) for a fixed time per batch, and prints one
// JSON object per epoch with what it measured:
//   {"epoch":E,"rank":R,"samples":N,"bytes":B,"batches":K,"wall_s":W,"mbit":M,
//    "next_p50_us":..,"next_p99_us":..,"stall_s":S,"stall_fraction":S/W,"daemon_wait_us":..,
//    "slow_nexts":N,"slow_next_s":..,"open_us":..}
// stall = time spent inside Loader::Next() (waiting for data), as the trainer sees it;
// open_us: OpenLoader's round trip (not part of the wall time);
// slow_nexts / slow_next_s: the calls after the first that took over 1 ms, and their time.
//
//   sc_trainer_bench --socket PATH --dataset NAME [--batch-size 32] [--shuffle none|global|block]
//       [--seed 0] [--epoch 0] [--epochs 1] [--rank 0] [--world-size 1] [--drop-last]
//       [--compute-us 0] [--touch] [--block-window 0] [--ids-out FILE] [--max-batches N]
// --max-batches N stops each epoch after N batches (a prefix of the epoch).
// --ids-out writes the sample ids of the (last) epoch, one per line, in the order received.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "shardcache/client.h"

namespace {

[[noreturn]] void Usage(const char* msg) {
  std::fprintf(stderr, "sc_trainer_bench: %s\n", msg);
  std::exit(2);
}

double Percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t i = std::min(v.size() - 1, static_cast<size_t>(q * (v.size() - 1) + 0.5));
  return v[i];
}

struct Args {
  std::string socket = shardcache::kDefaultSocketPath;
  shardcache::LoaderOptions loader;
  uint64_t epochs = 1, compute_us = 0, max_batches = UINT64_MAX;
  bool touch = false;
  std::string ids_out;
};

Args Parse(int argc, char** argv) {
  Args args;
  shardcache::LoaderOptions& o = args.loader;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto val = [&]() -> std::string {
      if (i + 1 >= argc) Usage(("missing value for " + a).c_str());
      return argv[++i];
    };
    if (a == "--socket") args.socket = val();
    else if (a == "--dataset") o.dataset = val();
    else if (a == "--batch-size") o.batch_size = static_cast<uint32_t>(std::stoul(val()));
    else if (a == "--seed") o.seed = std::stoull(val());
    else if (a == "--epoch") o.epoch = std::stoull(val());
    else if (a == "--epochs") args.epochs = std::stoull(val());
    else if (a == "--rank") o.rank = static_cast<uint32_t>(std::stoul(val()));
    else if (a == "--world-size") o.world_size = static_cast<uint32_t>(std::stoul(val()));
    else if (a == "--block-window") o.block_window_shards = static_cast<uint32_t>(std::stoul(val()));
    else if (a == "--drop-last") o.drop_last = true;
    else if (a == "--compute-us") args.compute_us = std::stoull(val());
    else if (a == "--touch") args.touch = true;
    else if (a == "--ids-out") args.ids_out = val();
    else if (a == "--max-batches") args.max_batches = std::stoull(val());
    else if (a == "--shuffle") {
      auto s = shardcache::ParseShuffle(val());
      if (!s.ok()) Usage(s.status().message().c_str());
      o.shuffle = *s;
    } else {
      Usage(("unknown argument " + a).c_str());
    }
  }
  if (o.dataset.empty()) Usage("--dataset is required");
  return args;
}

using Clock = std::chrono::steady_clock;

// What one epoch measured.
struct Epoch {
  std::vector<double> next_us;  // each Next()'s time
  std::vector<uint64_t> ids;    // with --ids-out: the sample ids in the order received
  uint64_t samples = 0, bytes = 0, sum = 0, daemon_wait_us = 0;
  double stall_s = 0, wall_s = 0;
};

// Reads the loader's epoch (or its first --max-batches batches); false after printing an error.
bool ReadEpoch(shardcache::Loader& loader, const Args& args, Epoch* ep) {
  const auto t0 = Clock::now();
  while (ep->next_us.size() < args.max_batches) {
    const auto n0 = Clock::now();
    auto batch = loader.Next();
    const double waited = std::chrono::duration<double>(Clock::now() - n0).count();
    if (!batch.ok()) {
      if (batch.status().code() == shardcache::StatusCode::kOutOfRange) break;
      std::fprintf(stderr, "sc_trainer_bench: %s\n", batch.status().ToString().c_str());
      return false;
    }
    ep->stall_s += waited;
    ep->next_us.push_back(waited * 1e6);
    ep->samples += batch->size();
    if (!args.ids_out.empty()) ep->ids.insert(ep->ids.end(), batch->sample_ids().begin(), batch->sample_ids().end());
    ep->bytes += batch->payload_bytes();
    ep->daemon_wait_us += batch->wait_us();
    if (args.touch) {
      const uint8_t* p = batch->data();
      for (uint64_t k = 0; k < batch->payload_bytes(); k += 64) ep->sum += p[k];
    }
    if (args.compute_us) std::this_thread::sleep_for(std::chrono::microseconds(args.compute_us));
  }
  ep->wall_s = std::chrono::duration<double>(Clock::now() - t0).count();
  return true;
}

void PrintEpoch(uint64_t e, uint32_t rank, const Epoch& ep, double open_us) {
  uint64_t slow_nexts = 0;
  double slow_next_s = 0;
  for (size_t k = 1; k < ep.next_us.size(); ++k) {
    if (ep.next_us[k] > 1000) {
      ++slow_nexts;
      slow_next_s += ep.next_us[k] / 1e6;
    }
  }
  const double wall = ep.wall_s;
  std::printf(
      "{\"epoch\":%llu,\"rank\":%u,\"samples\":%llu,\"bytes\":%llu,\"batches\":%zu,"
      "\"wall_s\":%.6f,\"mbit\":%.3f,\"next_p50_us\":%.1f,\"next_p99_us\":%.1f,"
      "\"first_next_us\":%.1f,\"max_next_us\":%.1f,\"stall_s\":%.6f,\"stall_fraction\":%.5f,"
      "\"daemon_wait_us\":%llu,\"slow_nexts\":%llu,\"slow_next_s\":%.6f,\"touch_sum\":%llu,\"open_us\":%.1f}\n",
      static_cast<unsigned long long>(e), rank, static_cast<unsigned long long>(ep.samples),
      static_cast<unsigned long long>(ep.bytes), ep.next_us.size(), wall, wall > 0 ? ep.bytes * 8 / wall / 1e6 : 0.0,
      Percentile(ep.next_us, 0.5), Percentile(ep.next_us, 0.99), ep.next_us.empty() ? 0.0 : ep.next_us.front(),
      Percentile(ep.next_us, 1.0), ep.stall_s, wall > 0 ? ep.stall_s / wall : 0.0,
      static_cast<unsigned long long>(ep.daemon_wait_us), static_cast<unsigned long long>(slow_nexts), slow_next_s,
      static_cast<unsigned long long>(ep.sum), open_us);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  Args args = Parse(argc, argv);
  auto client = shardcache::Client::Connect(args.socket);
  if (!client.ok()) {
    std::fprintf(stderr, "sc_trainer_bench: %s\n", client.status().ToString().c_str());
    return 1;
  }
  shardcache::LoaderOptions& o = args.loader;
  const uint64_t first_epoch = o.epoch;
  for (uint64_t e = first_epoch; e < first_epoch + args.epochs; ++e) {
    o.epoch = e;
    const auto open0 = Clock::now();
    auto loader = (*client)->OpenLoader(o);
    const double open_us = std::chrono::duration<double, std::micro>(Clock::now() - open0).count();
    if (!loader.ok()) {
      std::fprintf(stderr, "sc_trainer_bench: %s\n", loader.status().ToString().c_str());
      return 1;
    }
    Epoch ep;
    if (!ReadEpoch(**loader, args, &ep)) return 1;
    if (!args.ids_out.empty()) {
      if (FILE* f = std::fopen(args.ids_out.c_str(), "w")) {
        for (uint64_t id : ep.ids) std::fprintf(f, "%llu\n", static_cast<unsigned long long>(id));
        std::fclose(f);
      }
    }
    PrintEpoch(e, o.rank, ep, open_us);
  }
  return 0;
}
