#include "daemon/checkpoint/checkpoint_transfer.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <set>
#include <thread>

#include <grpcpp/grpcpp.h>
#include <spdlog/spdlog.h>

#include "common/fs.h"
#include "daemon/checkpoint/object_name.h"
#include "daemon/upstream/chunk_codec.h"
#include "daemon/upstream/grpc_source.h"

namespace shardcache::checkpoint {
namespace {

using Clock = std::chrono::steady_clock;

using upstream::FromGrpcStatus;

// PutPart calls at once: measured, from 16 (a checkpoint is a few hundred parts: a slow start
// from 4 spent most of a 256 MiB upload ramping up at 80 ms / 128 KiB), between 2 and max_parallel.
upstream::StreamControllerOptions PartStreams(int max_parallel) {
  upstream::StreamControllerOptions o;
  o.max = std::max(1, max_parallel);
  o.initial = std::min(16, o.max);
  o.min = std::min(2, o.max);
  o.min_period_chunks = 8;
  return o;
}

}  // namespace

struct CheckpointTransfer::UploadJob {
  std::string name;
  std::string path;
  int fd = -1;
  v1::UploadHeader header;
  std::string upload_id;
  std::vector<uint64_t> todo;   // parts to send
  std::atomic<size_t> next{0};  // index into todo
  TransferProgress* progress = nullptr;
  const std::atomic<bool>* stop = nullptr;
  Mutex mu;
  Status failed GUARDED_BY(mu);
  std::atomic<int> running{0};    // PutPart calls in flight
  std::atomic<uint64_t> sent{0};  // raw part bytes the receiver took
};

CheckpointTransfer::CheckpointTransfer(CheckpointTransferOptions options, UpstreamCalls calls)
    : options_(options),
      calls_(std::move(calls)),
      bucket_(options.bandwidth_bytes_per_s),
      streams_(PartStreams(options.max_parallel)) {
  for (int i = 0; i < std::max(1, options_.max_parallel); ++i) stubs_.push_back(calls_.stub(i));
}

std::unique_ptr<grpc::ClientContext> CheckpointTransfer::Context() const {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(std::chrono::system_clock::now() + options_.call_timeout);
  if (calls_.add_auth) calls_.add_auth(ctx.get());
  return ctx;
}

Result<v1::UploadHeader> CheckpointTransfer::HashParts(const std::string& name, int fd, uint64_t size,
                                                       const std::string& path) const {
  v1::UploadHeader h;
  h.set_name(name);
  h.set_size(size);
  h.set_part_bytes(options_.part_bytes);
  std::string buf;
  for (uint64_t part = 0; part * options_.part_bytes < size; ++part) {
    buf.resize(PartLength(size, options_.part_bytes, part));
    SC_RETURN_IF_ERROR(PreadFull(fd, buf.data(), buf.size(), part * options_.part_bytes, path));
    h.add_part_hashes(PartHashBytes(buf.data(), buf.size()));
  }
  return h;
}

Status CheckpointTransfer::SendPart(UploadJob& u, v1::Origin::StubInterface& stub, uint64_t part, std::string* buf,
                                    upstream::ChunkEncoder& encoder) {
  const uint64_t len = PartLength(u.header.size(), options_.part_bytes, part);
  buf->resize(len);
  for (int attempt = 0;; ++attempt) {
    if (u.stop != nullptr && u.stop->load()) return Cancelled("checkpoint upload of '" + u.name + "' stopped");
    // Read again on every attempt: a part the receiver found corrupt is not resent from memory
    // that may be what went bad.
    SC_RETURN_IF_ERROR(PreadFull(u.fd, buf->data(), len, part * options_.part_bytes, u.path));
    v1::PutPartRequest req;
    req.set_name(u.name);
    req.set_upload_id(u.upload_id);
    req.set_part(part);
    v1::Codec codec = v1::RAW;
    encoder.Encode(reinterpret_cast<const uint8_t*>(buf->data()), len, /*allow_zstd=*/true, &codec,
                   req.mutable_payload());
    req.set_codec(codec);
    SC_RETURN_IF_ERROR(bucket_.Take(req.payload().size(), Clock::now() + options_.call_timeout));
    v1::UploadState resp;
    auto ctx = Context();
    const Status s = FromGrpcStatus(stub.PutPart(ctx.get(), req, &resp));
    if (s.ok()) {
      u.progress->sent_bytes.fetch_add(req.payload().size());
      u.progress->done_bytes.fetch_add(len);
      return s;
    }
    // DataLoss here is the receiver finding the part corrupt on the way: sent again.
    if ((!upstream::Retryable(s.code()) && s.code() != StatusCode::kDataLoss) || attempt >= options_.retries) {
      return s.WithContext(calls_.where + ": part " + std::to_string(part) + " of checkpoint '" + u.name + "'");
    }
    spdlog::debug("checkpoint '{}' part {}: {}; sending it again", u.name, part, s.ToString());
    std::this_thread::sleep_for(std::chrono::milliseconds(100 << std::min(attempt, 5)));
  }
}

Status CheckpointTransfer::SendParts(UploadJob& u) {
  // Worker `index` sends parts while index < the controller's limit, and waits while it is not.
  auto worker = [&](int index) {
    std::string buf;
    upstream::ChunkEncoder encoder;  // one per worker: after an incompressible part it stops trying for a while
    for (;;) {
      while (index >= streams_.limit() && u.next.load() < u.todo.size()) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
      const size_t i = u.next.fetch_add(1);
      if (i >= u.todo.size()) return;
      {
        MutexLock lock(&u.mu);
        if (!u.failed.ok()) return;
      }
      const int running = u.running.fetch_add(1) + 1;
      const auto t0 = Clock::now();
      const Status s = SendPart(u, *stubs_[index], u.todo[i], &buf, encoder);
      u.running.fetch_sub(1);
      if (!s.ok()) {
        MutexLock lock(&u.mu);
        if (u.failed.ok()) u.failed = s;
        return;
      }
      const uint64_t len = PartLength(u.header.size(), options_.part_bytes, u.todo[i]);
      streams_.Observe(Clock::now(), u.sent.fetch_add(len) + len, /*saturated=*/u.next.load() < u.todo.size(), len,
                       Clock::now() - t0, running);
    }
  };
  const int n = static_cast<int>(std::min<size_t>(stubs_.size(), u.todo.size()));
  std::vector<std::thread> threads;
  for (int i = 0; i < n; ++i) threads.emplace_back(worker, i);
  for (auto& t : threads) t.join();
  MutexLock lock(&u.mu);
  return u.failed;
}

Status CheckpointTransfer::Upload(const std::string& name, const std::string& path, TransferProgress* progress,
                                  const std::atomic<bool>* stop) {
  SC_ASSIGN_OR_RETURN(UniqueFd fd, OpenFile(path, O_RDONLY));
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return ErrnoStatus(errno, "stat " + path);
  UploadJob u;
  u.name = name;
  u.path = path;
  u.fd = fd.get();
  u.progress = progress;
  u.stop = stop;
  SC_ASSIGN_OR_RETURN(u.header, HashParts(name, fd.get(), static_cast<uint64_t>(st.st_size), path));
  progress->total_bytes.store(u.header.size());
  progress->done_bytes.store(0);
  progress->sent_bytes.store(0);
  progress->held_bytes.store(0);
  v1::UploadState state;
  auto ctx = Context();
  SC_RETURN_IF_ERROR(FromGrpcStatus(stubs_[0]->BeginUpload(ctx.get(), u.header, &state)).WithContext(calls_.where));
  u.upload_id = state.upload_id();
  if (state.committed()) {
    progress->done_bytes.store(u.header.size());
    return Status::Ok();
  }
  const std::set<uint64_t> held(state.verified_parts().begin(), state.verified_parts().end());
  for (uint64_t p = 0; p < static_cast<uint64_t>(u.header.part_hashes_size()); ++p) {
    if (held.count(p) != 0) {
      const uint64_t len = PartLength(u.header.size(), options_.part_bytes, p);
      progress->held_bytes.fetch_add(len);
      progress->done_bytes.fetch_add(len);
    } else {
      u.todo.push_back(p);
    }
  }
  SC_RETURN_IF_ERROR(SendParts(u));
  v1::CommitUploadRequest commit;
  commit.set_name(name);
  commit.set_upload_id(u.upload_id);
  auto cctx = Context();
  SC_RETURN_IF_ERROR(FromGrpcStatus(stubs_[0]->CommitUpload(cctx.get(), commit, &state)).WithContext(calls_.where));
  if (!state.committed()) {
    return Aborted(calls_.where + " did not commit checkpoint '" + name + "': it holds " +
                   std::to_string(state.verified_parts_size()) + " of " +
                   std::to_string(u.header.part_hashes_size()) + " parts verified");
  }
  return Status::Ok();
}

Status CheckpointTransfer::ReadParts(const std::string& name, int fd, uint64_t size, uint32_t part_bytes) {
  upstream::ChunkDecoder decoder;
  AlignedBuffer bytes;
  for (uint64_t part = 0; part * part_bytes < size; ++part) {
    v1::ReadPartRequest req;
    req.set_name(name);
    req.set_part_bytes(part_bytes);
    req.set_part(part);
    req.set_accept_zstd(true);
    v1::ObjectPart resp;
    auto ctx = Context();
    SC_RETURN_IF_ERROR(FromGrpcStatus(stubs_[0]->ReadPart(ctx.get(), req, &resp)).WithContext(calls_.where));
    const uint64_t len = PartLength(size, part_bytes, part);
    const std::string where = calls_.where + " checkpoint '" + name + "' part " + std::to_string(part);
    SC_RETURN_IF_ERROR(decoder.Decode(resp.codec(), resp.payload(), len, where, &bytes));
    if (PartHashBytes(bytes.data(), len) != resp.hash()) return DataLoss(where + ": the bytes do not match their hash");
    SC_RETURN_IF_ERROR(PwriteFull(fd, bytes.data(), len, part * part_bytes, name));
  }
  return Status::Ok();
}

Result<uint64_t> CheckpointTransfer::Download(const std::string& name, const std::string& dest) {
  v1::StatObjectRequest req;
  req.set_name(name);
  v1::ObjectInfo info;
  auto ctx = Context();
  SC_RETURN_IF_ERROR(FromGrpcStatus(stubs_[0]->StatObject(ctx.get(), req, &info)).WithContext(calls_.where));
  if (info.part_bytes() == 0) return DataLoss(calls_.where + " gave checkpoint '" + name + "' no part size");
  SC_ASSIGN_OR_RETURN(UniqueFd fd, OpenFile(dest, O_WRONLY | O_CREAT | O_TRUNC, 0600));
  SC_RETURN_IF_ERROR(ReadParts(name, fd.get(), info.size(), info.part_bytes()));
  if (::fsync(fd.get()) != 0) return ErrnoStatus(errno, "fsync " + dest);
  return info.size();
}

}  // namespace shardcache::checkpoint
