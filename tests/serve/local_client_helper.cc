// A trainer stand-in for the local-service tests, run as a separate process so that tests can
// SIGKILL it mid-batch or run it as another uid.
//
//   local_client_helper SOCKET DATASET BATCH_SIZE HOLD_BATCHES MARKER
// Connects, opens a global-shuffle loader, takes HOLD_BATCHES batches without releasing them,
// touches every byte, writes MARKER, then sleeps until killed. Exit codes: the StatusCode of a
// failure (e.g. 7 = PermissionDenied), printed as text on stdout.
//
//   local_client_helper SOCKET NAME BYTES save MARKER
// Saves checkpoint NAME of BYTES bytes (byte i = i % 251) through the daemon, writes MARKER
// ("saved SIZE") and exits.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "shardcache/client.h"

// Written aside and renamed: a waiter that sees the marker sees all of it.
void WriteMarker(const std::string& marker, const std::string& text) {
  const std::string aside = marker + ".tmp";
  std::ofstream(aside) << text << "\n";
  std::rename(aside.c_str(), marker.c_str());
}

int SaveCheckpoint(shardcache::Client& client, const std::string& name, long long bytes, const std::string& marker) {
  std::string data(static_cast<size_t>(bytes), '\0');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i % 251);
  auto w = client.Checkpoint(name);
  shardcache::Result<uint64_t> size = w.ok() ? shardcache::Result<uint64_t>(uint64_t{0}) : w.status();
  if (w.ok()) {
    shardcache::Status s = (*w)->Write(data.data(), data.size());
    size = s.ok() ? (*w)->Close() : shardcache::Result<uint64_t>(s);
  }
  if (!size.ok()) {
    std::printf("%s\n", size.status().ToString().c_str());
    return static_cast<int>(size.status().code());
  }
  WriteMarker(marker, "saved " + std::to_string(*size));
  return 0;
}

int main(int argc, char** argv) {
  if (argc != 6) {
    std::fprintf(stderr, "usage: %s SOCKET DATASET BATCH_SIZE HOLD_BATCHES MARKER | SOCKET NAME BYTES save MARKER\n",
                 argv[0]);
    return 2;
  }
  auto client = shardcache::Client::Connect(argv[1]);
  if (!client.ok()) {
    std::printf("%s\n", client.status().ToString().c_str());
    return static_cast<int>(client.status().code());
  }
  if (std::string(argv[4]) == "save") return SaveCheckpoint(**client, argv[2], std::atoll(argv[3]), argv[5]);
  shardcache::LoaderOptions o;
  o.dataset = argv[2];
  o.batch_size = static_cast<uint32_t>(std::atoi(argv[3]));
  o.shuffle = shardcache::Shuffle::kGlobal;
  o.seed = static_cast<uint64_t>(getpid());
  auto loader = (*client)->OpenLoader(o);
  if (!loader.ok()) {
    std::printf("%s\n", loader.status().ToString().c_str());
    return static_cast<int>(loader.status().code());
  }
  std::vector<shardcache::Batch> held;
  uint64_t sum = 0;
  for (int i = 0; i < std::atoi(argv[4]); ++i) {
    auto b = (*loader)->Next();
    if (!b.ok()) {
      std::printf("%s\n", b.status().ToString().c_str());
      return static_cast<int>(b.status().code());
    }
    for (uint64_t k = 0; k < b->payload_bytes(); ++k) sum += b->data()[k];
    held.push_back(std::move(*b));
  }
  WriteMarker(argv[5], "ready " + std::to_string(sum));
  for (;;) pause();
}
