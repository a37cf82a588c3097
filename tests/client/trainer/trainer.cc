// A trainer built against the *installed* libshardcache (C++17, pkg-config or find_package):
// reads one epoch and prints "samples=<n> bytes=<m> sum=<s>".
//   trainer SOCKET DATASET
#include <shardcache/client.h>

#include <cstdio>

int main(int argc, char** argv) {
  if (argc != 3) return 2;
  auto client = shardcache::Client::Connect(argv[1]);
  if (!client.ok()) {
    std::fprintf(stderr, "%s\n", client.status().ToString().c_str());
    return 1;
  }
  shardcache::LoaderOptions o;
  o.dataset = argv[2];
  o.batch_size = 16;
  o.shuffle = shardcache::Shuffle::kGlobal;
  auto loader = (*client)->OpenLoader(o);
  if (!loader.ok()) {
    std::fprintf(stderr, "%s\n", loader.status().ToString().c_str());
    return 1;
  }
  unsigned long long samples = 0, bytes = 0, sum = 0;
  while (auto batch = (*loader)->Next()) {
    for (size_t i = 0; i < batch->size(); ++i) {
      for (uint8_t b : batch->sample(i)) sum += b;
      bytes += batch->sample(i).size;
    }
    samples += batch->size();
  }
  std::printf("samples=%llu bytes=%llu sum=%llu\n", samples, bytes, sum);
  return 0;
}
