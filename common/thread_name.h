// NameThisThread: gives the calling thread a name that `top -H`, `ps -L`, `perf` and gdb show
// (/proc/PID/task/TID/comm), so an operator can tell the daemon's fetch workers from its batch
// assemblers or its NVMe writer. Every thread the daemon starts names itself first thing, with
// an "sc-" prefix; the threads gRPC and RocksDB start carry their own names.
//
// Linux keeps at most 15 bytes of a name: a longer one is cut there. A failure (a thread that
// is exiting) is ignored: a name is an aid, never a reason to fail.
#pragma once

#include <string>

namespace shardcache {

constexpr size_t kMaxThreadNameBytes = 15;

void NameThisThread(const std::string& name);

// The calling thread's name as the kernel holds it ("" when it cannot be read).
std::string ThisThreadName();

}  // namespace shardcache
