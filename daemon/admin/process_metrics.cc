#include "daemon/admin/process_metrics.h"

#include <dirent.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "common/allocator.h"

namespace shardcache::admin {

ProcessMetrics::ProcessMetrics(metrics::Registry& r)
    : resident_bytes_(r.GetGauge("shardcache_process_resident_bytes", "Resident set size of the daemon")),
      virtual_bytes_(r.GetGauge("shardcache_process_virtual_bytes", "Virtual memory size of the daemon")),
      cpu_ticks_(r.GetScaledCounter("shardcache_process_cpu_seconds_total", "User + system CPU time used by the daemon",
                                    1.0 / static_cast<double>(sysconf(_SC_CLK_TCK)))),
      uptime_seconds_(r.GetGauge("shardcache_process_uptime_seconds", "Seconds since the daemon started")),
      open_fds_(r.GetGauge("shardcache_process_open_fds", "Open file descriptors of the daemon")),
      threads_(r.GetGauge("shardcache_process_threads", "Threads of the daemon")),
      heap_in_use_bytes_(r.GetGauge("shardcache_process_heap_in_use_bytes",
                                    "Bytes of malloc heap the daemon holds in live allocations")),
      heap_free_bytes_(r.GetGauge("shardcache_process_heap_free_bytes",
                                  "Bytes of heap the allocator holds for reuse, not in live allocations")) {}

void ProcessMetrics::Update() {
  uptime_seconds_->Set(std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count());
  const double page = static_cast<double>(sysconf(_SC_PAGESIZE));
  {
    std::ifstream statm("/proc/self/statm");
    double size_pages = 0, resident_pages = 0;
    if (statm >> size_pages >> resident_pages) {
      virtual_bytes_->Set(size_pages * page);
      resident_bytes_->Set(resident_pages * page);
    }
  }
  {
    // /proc/self/stat: "pid (comm) state ..." — comm may hold spaces, so parse after the last ')'.
    std::ifstream stat("/proc/self/stat");
    std::string all((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
    const size_t close = all.rfind(')');
    if (close != std::string::npos) {
      std::istringstream in(all.substr(close + 2));
      std::string field;
      // Fields after comm start at 3 (state); utime is 14, stime 15, num_threads 20.
      uint64_t utime = 0, stime = 0;
      double nthreads = 0;
      for (int i = 3; i <= 20 && (in >> field); ++i) {
        if (i == 14) utime = std::stoull(field);
        if (i == 15) stime = std::stoull(field);
        if (i == 20) nthreads = std::stod(field);
      }
      cpu_ticks_->Advance(utime + stime);
      threads_->Set(nthreads);
    }
  }
  // Live heap against free heap tells a leak (in-use grows) from fragmentation (free grows).
  const HeapStats heap = ReadHeapStats();
  heap_in_use_bytes_->Set(static_cast<double>(heap.in_use_bytes));
  heap_free_bytes_->Set(static_cast<double>(heap.free_bytes));
  if (DIR* d = opendir("/proc/self/fd")) {
    int n = 0;
    while (dirent* e = readdir(d)) {
      if (e->d_name[0] != '.') ++n;
    }
    closedir(d);
    open_fds_->Set(n - 1);  // minus the descriptor of this very listing
  }
}

}  // namespace shardcache::admin
