// Chunk codec: how a chunk's bytes travel inside one Origin ChunkMessage — RAW, or one zstd
// frame chosen per message when it pays. Checkpoint parts (PutPart, ReadPart) travel the same
// way, through the overloads that take a codec and payload instead of a ChunkMessage.
//
// Encoding is adaptive: every chunk is tried at zstd level 1 and sent RAW when the frame is
// not smaller than ~97% of the input (JPEG, float noise, already-compressed data). A stream
// of incompressible chunks would pay a failed compression attempt per chunk, so after a miss
// the encoder sends the next `retry_every - 1` chunks RAW without trying, then tries again.
//
// Decoding treats the frame as untrusted: the zstd window is capped (ZSTD_d_windowLogMax), the
// output is capped at the length the *manifest* gives for the chunk, and the frame must
// produce exactly that many bytes — a small frame that claims gigabytes (decompression bomb)
// is DataLoss, never an allocation.
//
// Thread safety: an encoder or decoder belongs to one stream at a time (not thread-safe);
// make one per stream.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "common/fs.h"
#include "common/status.h"
#include "shardcache/origin.pb.h"

namespace shardcache::upstream {

struct ChunkEncoderOptions {
  // zstd compression level. Level 1 is ~330 MB/s per core here (see PITFALLS.md).
  int level = 1;
  // Send RAW unless compressed_bytes < raw_bytes * max_ratio.
  double max_ratio = 0.97;
  // After an incompressible chunk, try compressing again only every this many chunks.
  uint32_t retry_every = 16;
  // Chunks below this size are always sent RAW (framing costs more than it saves).
  size_t min_bytes = 512;
  // A message of at least 4x this many bytes is first tried on its first `probe_bytes`: when
  // those do not shrink by max_ratio, it goes RAW without compressing the rest. zstd gives up on
  // incompressible data only near the end of its input, so each first part of a chunk (1 MiB,
  // a fresh encoder per request) cost the origin a whole compression pass, ~3 ms, for nothing;
  // at a cold start that was 128 streams' worth of CPU ahead of the first batch's ranges.
  // 0: no probe.
  size_t probe_bytes = 16 << 10;
};

class ChunkEncoder {
 public:
  explicit ChunkEncoder(ChunkEncoderOptions options = {});
  ~ChunkEncoder();
  ChunkEncoder(const ChunkEncoder&) = delete;
  ChunkEncoder& operator=(const ChunkEncoder&) = delete;

  // Sets msg's codec, raw_bytes and payload from `data`. `allow_zstd` false (a client that
  // does not accept zstd) always yields RAW.
  void Encode(const uint8_t* data, size_t size, bool allow_zstd, v1::ChunkMessage* msg);
  // The same for bytes that travel outside a ChunkMessage (checkpoint parts): sets *codec and
  // *payload; the raw length is the caller's to send.
  void Encode(const uint8_t* data, size_t size, bool allow_zstd, v1::Codec* codec, std::string* payload);

  // Chunks sent without a compression attempt because of the incompressible streak (tests).
  uint64_t skipped_attempts() const { return skipped_attempts_; }
  // Chunks sent RAW because their first probe_bytes did not compress (tests).
  uint64_t probe_refusals() const { return probe_refusals_; }

 private:
  const ChunkEncoderOptions options_;
  void* cctx_;                 // ZSTD_CCtx*, reused across chunks
  uint32_t skip_remaining_ = 0;
  uint64_t skipped_attempts_ = 0;
  uint64_t probe_refusals_ = 0;
  std::string probe_out_;  // the probe's output, reused
  // True when `size` bytes at `data` shrink below max_ratio with zstd into `out`'s first `limit`
  // bytes; n: the compressed size then.
  bool Compresses(const uint8_t* data, size_t size, char* out, size_t limit, size_t* n);
};

// A zstd frame is inflated with a decompression context kept per thread (made on the thread's
// first frame): a context is ~100 KiB to make and a fetch decodes one range per sample, so
// making one per decoder cost 3% of the node's CPU on a compressible cold epoch.
class ChunkDecoder {
 public:
  // Largest zstd window a frame may use: 2^27 = 128 MiB covers kMaxChunkBytes.
  static constexpr int kWindowLogMax = 27;

  // Decodes `msg` into `out` (allocated here, size expected_bytes). DataLoss, naming `where`,
  // when msg.raw_bytes != expected_bytes, the codec is unknown, the frame is malformed,
  // needs a larger window, or does not produce exactly expected_bytes.
  Status Decode(const v1::ChunkMessage& msg, uint64_t expected_bytes, const std::string& where,
                AlignedBuffer* out);
  // The same for a payload that travels outside a ChunkMessage (checkpoint parts), whose raw
  // length the receiver knows from elsewhere: DataLoss, naming `where`, for an unknown codec,
  // a malformed frame, or one that does not produce exactly expected_bytes.
  Status Decode(v1::Codec codec, const std::string& payload, uint64_t expected_bytes, const std::string& where,
                AlignedBuffer* out);
};

}  // namespace shardcache::upstream
