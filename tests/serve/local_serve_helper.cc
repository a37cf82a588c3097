// A minimal node daemon for client tests in other languages (python/tests): serves every dataset
// under ROOT (FileSource) on the Unix socket SOCKET until SIGTERM / SIGINT. Prints "ready" once
// the socket accepts.
//
//   local_serve_helper ROOT SOCKET [ARENA_BYTES [SLOTS]]
#include <signal.h>

#include <cstdio>
#include <cstdlib>

#include "common/log.h"
#include "daemon/serve/local_service.h"
#include "daemon/upstream/file_source.h"

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s ROOT SOCKET [ARENA_BYTES [SLOTS]]\n", argv[0]);
    return 2;
  }
  (void)shardcache::SetupLogging("warn");
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);  // threads inherit the mask; sigwait below
  auto files = shardcache::upstream::FileSource::Open(argv[1]);
  if (!files.ok()) {
    std::fprintf(stderr, "%s\n", files.status().ToString().c_str());
    return 1;
  }
  shardcache::serve::LocalServiceOptions o;
  o.socket_path = argv[2];
  if (argc > 3) o.arena_bytes = std::strtoull(argv[3], nullptr, 10);
  if (argc > 4) o.slot_count = static_cast<uint32_t>(std::strtoul(argv[4], nullptr, 10));
  o.prefetch_lookahead_bytes = 0;  // no cache tier below to warm
  shardcache::serve::LocalService svc(**files, o);
  if (auto s = svc.Start(); !s.ok()) {
    std::fprintf(stderr, "%s\n", s.ToString().c_str());
    return 1;
  }
  std::printf("ready\n");
  std::fflush(stdout);
  int sig = 0;
  sigwait(&set, &sig);
  svc.Stop();
  return 0;
}
