// CheckpointTransfer: moves one checkpoint file between a node and its upstream's receiving end
// (origin.proto's BeginUpload / PutPart / CommitUpload, StatObject / ReadPart).
//
// Upload: the file is cut into parts of part_bytes, each hashed (xxh3-128); BeginUpload says
// which parts the receiver holds already (a resumed upload: after a restart of either side only
// the others cross the link); the rest go as PutPart calls on connections of their own, as many
// at once as the link needs — a StreamController (upstream/stream_controller.h) hill-climbs the
// count on measured goodput between 2 and max_parallel (from 16), and keeps what it learned for the next
// upload (each stream tops out at window / RTT) — zstd where it pays, through a
// token bucket (checkpoints.upload_bandwidth: the share of the link left to training reads);
// CommitUpload then makes the receiver check every part and rename the object into place. A
// part the receiver found corrupt is sent again (up to `retries` times); transport failures
// are retried with backoff until call_timeout passes without progress.
//
// Download: StatObject, then every part by ReadPart, each checked against the hash it came with,
// written into `dest` and fsynced.
//
// Thread safety: Upload and Download may run concurrently (each call uses its own threads and
// encoders; the stubs are thread-safe gRPC stubs).
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "daemon/checkpoint/object_name.h"
#include "daemon/upstream/chunk_codec.h"
#include "daemon/upstream/stream_controller.h"
#include "daemon/upstream/token_bucket.h"
#include "shardcache/origin.grpc.pb.h"

namespace shardcache::checkpoint {

inline constexpr uint32_t kDefaultPartBytes = kMaxPartBytes;

struct CheckpointTransferOptions {
  uint32_t part_bytes = kDefaultPartBytes;
  // PutPart calls in flight: at most this many (each holds a part, 2 x part_bytes of memory).
  int max_parallel = 64;
  uint64_t bandwidth_bytes_per_s = 0;      // 0 = no cap
  std::chrono::milliseconds call_timeout{60000};
  int retries = 5;                         // per part, after the first attempt
};

// Makes the stub of connection `index` (0 .. max_parallel-1) and adds credentials to a call.
struct UpstreamCalls {
  std::function<std::unique_ptr<v1::Origin::StubInterface>(int index)> stub;
  std::function<void(grpc::ClientContext*)> add_auth;
  std::string where;  // "upstream host:port", for messages
};

// What an upload moved, for progress reports and tests (Upload starts every field at 0).
struct TransferProgress {
  std::atomic<uint64_t> total_bytes{0};
  std::atomic<uint64_t> done_bytes{0};   // parts the receiver holds (verified before, or sent now)
  std::atomic<uint64_t> sent_bytes{0};   // payload bytes put on the wire by this upload
  std::atomic<uint64_t> held_bytes{0};   // of done_bytes, held by the receiver already (a resumed upload)
};

class CheckpointTransfer {
 public:
  CheckpointTransfer(CheckpointTransferOptions options, UpstreamCalls calls);

  // Uploads the file at `path` as `name`; returns once the receiver committed it. `stop`
  // (nullable) ends it early with Cancelled.
  Status Upload(const std::string& name, const std::string& path, TransferProgress* progress,
                const std::atomic<bool>* stop);
  // Reads committed object `name` into a new file `dest` (fsynced); its size.
  Result<uint64_t> Download(const std::string& name, const std::string& dest);

  void SetBandwidth(uint64_t bytes_per_s) { bucket_.SetRate(bytes_per_s); }
  const std::string& where() const { return calls_.where; }

 private:
  struct UploadJob;
  Result<v1::UploadHeader> HashParts(const std::string& name, int fd, uint64_t size, const std::string& path) const;
  Status SendParts(UploadJob& u);
  Status SendPart(UploadJob& u, v1::Origin::StubInterface& stub, uint64_t part, std::string* buf,
                  upstream::ChunkEncoder& encoder);
  Status ReadParts(const std::string& name, int fd, uint64_t size, uint32_t part_bytes);
  std::unique_ptr<grpc::ClientContext> Context() const;

  const CheckpointTransferOptions options_;
  const UpstreamCalls calls_;
  std::vector<std::unique_ptr<v1::Origin::StubInterface>> stubs_;
  upstream::TokenBucket bucket_;
  upstream::StreamController streams_;  // PutPart calls at once
};

}  // namespace shardcache::checkpoint
