// IoReader: batched O_DIRECT reads of chunk extents from segment files with io_uring.
//
// Each calling thread gets its own ring (thread_local, created on first use, depth kRingDepth),
// so readers never contend on a submission queue and no completion thread is needed: the
// thread that submits a batch reaps it. Short reads are resubmitted for the remainder, -EAGAIN
// and -EINTR completions are retried, other negative results become Status via ErrnoStatus.
// When io_uring_setup is refused (seccomp, io_uring_disabled) or use_io_uring is false, reads
// fall back to pread(2); the fallback is logged once per process.
//
// Thread safety: ReadBatch may be called concurrently from any number of threads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "common/status.h"

namespace shardcache::cache {

struct ReadRequest {
  int fd = -1;
  uint64_t offset = 0;   // 4 KiB aligned
  uint8_t* buf = nullptr;  // 4 KiB aligned, at least `length` bytes
  size_t length = 0;     // 4 KiB multiple
  const std::string* path = nullptr;  // for error messages
  Status status;         // out
};

class IoReader {
 public:
  static constexpr unsigned kRingDepth = 32;

  // Reads every request; per-request outcome in request.status. Returns non-OK only when the
  // batch as a whole could not be submitted.
  static Status ReadBatch(std::span<ReadRequest> requests, bool use_io_uring);

  // True when this thread's reads go through io_uring (sets the ring up if needed).
  static bool UsingIoUring(bool use_io_uring);
};

}  // namespace shardcache::cache
