// ParallelFor: runs fn(0..count-1) on a few std::threads that pull task numbers from one atomic
// counter, so uneven tasks (a short last chunk, a big shard) balance themselves. Used by the
// indexer to build sample indexes and hash chunks on all cores.
//
// Thread safety: fn is called concurrently from `threads` threads and must be thread-safe.
// The first failing task's Status is returned; tasks not yet started are skipped after it.
#pragma once

#include <cstdint>
#include <functional>

#include "common/status.h"

namespace shardcache::dataset {

// threads = 0 means std::thread::hardware_concurrency(). `tick`, when set, is called on the
// calling thread about every tick_ms while tasks run, and once more after they finish.
Status ParallelFor(uint64_t count, unsigned threads, const std::function<Status(uint64_t)>& fn,
                   const std::function<void()>& tick = nullptr, unsigned tick_ms = 100);

unsigned DefaultThreads(unsigned requested);

}  // namespace shardcache::dataset
