#include "daemon/cache/io_reader.h"

#include <liburing.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <memory>
#include <vector>

#include <spdlog/spdlog.h>

#include "common/fs.h"

namespace shardcache::cache {
namespace {

// One ring per thread. Destroyed at thread exit.
class ThreadRing {
 public:
  ThreadRing() {
    const int rc = io_uring_queue_init(IoReader::kRingDepth, &ring_, 0);
    if (rc < 0) {
      static std::atomic<bool> logged{false};
      if (!logged.exchange(true)) {
        spdlog::warn("io_uring_setup refused ({}); cache reads fall back to pread", std::strerror(-rc));
      }
      return;
    }
    ok_ = true;
  }
  ~ThreadRing() {
    if (ok_) io_uring_queue_exit(&ring_);
  }
  bool ok() const { return ok_; }
  io_uring* ring() { return &ring_; }

 private:
  io_uring ring_{};
  bool ok_ = false;
};

ThreadRing& Ring() {
  thread_local ThreadRing ring;
  return ring;
}

Status PreadOne(ReadRequest& r) {
  const std::string what = r.path ? *r.path : std::string("segment");
  return PreadFull(r.fd, r.buf, r.length, r.offset, what);
}

// In-flight progress of one request.
struct Progress {
  ReadRequest* req;
  size_t done = 0;
  bool finished = false;
};

// Applies one completion of p's read with result `res`; false when p needs another SQE (an
// interrupted or short read continues at its remainder).
bool Complete(Progress& p, int res) {
  if (res == -EAGAIN || res == -EINTR) return false;
  auto what = [&] { return p.req->path ? *p.req->path : std::string("segment"); };
  if (res < 0) {
    p.req->status = ErrnoStatus(-res, "read " + what() + " at offset " + std::to_string(p.req->offset + p.done));
  } else if (res == 0) {
    p.req->status = OutOfRange(what() + ": end of file at offset " + std::to_string(p.req->offset + p.done) +
                               ", wanted " + std::to_string(p.req->length - p.done) + " more bytes");
  } else {
    p.done += static_cast<size_t>(res);
    if (p.done < p.req->length) return false;
    p.req->status = Status::Ok();
  }
  p.finished = true;
  return true;
}

}  // namespace

bool IoReader::UsingIoUring(bool use_io_uring) { return use_io_uring && Ring().ok(); }

Status IoReader::ReadBatch(std::span<ReadRequest> requests, bool use_io_uring) {
  if (!use_io_uring || !Ring().ok()) {
    for (auto& r : requests) r.status = PreadOne(r);
    return Status::Ok();
  }
  io_uring* ring = Ring().ring();
  std::vector<Progress> progress;
  progress.reserve(requests.size());
  for (auto& r : requests) progress.push_back(Progress{&r});

  size_t next = 0;       // next request never submitted
  size_t inflight = 0;
  std::vector<size_t> resubmit;  // indexes of requests needing another SQE
  auto queue = [&](size_t i) -> bool {
    io_uring_sqe* sqe = io_uring_get_sqe(ring);
    if (sqe == nullptr) return false;
    Progress& p = progress[i];
    io_uring_prep_read(sqe, p.req->fd, p.req->buf + p.done,
                       static_cast<unsigned>(p.req->length - p.done), p.req->offset + p.done);
    io_uring_sqe_set_data64(sqe, i);
    ++inflight;
    return true;
  };

  while (next < progress.size() || inflight > 0 || !resubmit.empty()) {
    while (!resubmit.empty() && inflight < kRingDepth) {
      if (!queue(resubmit.back())) break;
      resubmit.pop_back();
    }
    while (next < progress.size() && inflight < kRingDepth) {
      if (!queue(next)) break;
      ++next;
    }
    int rc = io_uring_submit_and_wait(ring, 1);
    if (rc < 0 && rc != -EINTR && rc != -EAGAIN && rc != -EBUSY) {
      // Submission itself failed: finish what remains synchronously.
      spdlog::warn("io_uring_submit failed ({}); reading with pread", std::strerror(-rc));
      for (auto& p : progress) {
        if (!p.finished) p.req->status = PreadOne(*p.req);
      }
      // Drain completions still owed for requests already queued, so the ring stays usable.
      while (inflight > 0) {
        io_uring_cqe* cqe = nullptr;
        if (io_uring_wait_cqe(ring, &cqe) < 0) break;
        io_uring_cqe_seen(ring, cqe);
        --inflight;
      }
      return Status::Ok();
    }
    io_uring_cqe* cqe = nullptr;
    unsigned head;
    unsigned seen = 0;
    io_uring_for_each_cqe(ring, head, cqe) {
      ++seen;
      --inflight;
      const size_t i = static_cast<size_t>(io_uring_cqe_get_data64(cqe));
      Progress& p = progress[i];
      if (!Complete(p, cqe->res)) resubmit.push_back(i);
    }
    io_uring_cq_advance(ring, seen);
  }
  return Status::Ok();
}

}  // namespace shardcache::cache
