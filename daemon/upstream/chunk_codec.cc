#include "daemon/upstream/chunk_codec.h"

#include <zstd.h>

#include <cstring>
#include <memory>

namespace shardcache::upstream {

ChunkEncoder::ChunkEncoder(ChunkEncoderOptions options)
    : options_(options), cctx_(ZSTD_createCCtx()) {
  ZSTD_CCtx_setParameter(static_cast<ZSTD_CCtx*>(cctx_), ZSTD_c_compressionLevel, options_.level);
  // The decoder caps the window; never produce a frame it would refuse.
  ZSTD_CCtx_setParameter(static_cast<ZSTD_CCtx*>(cctx_), ZSTD_c_windowLog,
                         ChunkDecoder::kWindowLogMax < 23 ? ChunkDecoder::kWindowLogMax : 23);
  // Frames carry their content size, so a decoder can reject a lying frame before inflating.
  ZSTD_CCtx_setParameter(static_cast<ZSTD_CCtx*>(cctx_), ZSTD_c_contentSizeFlag, 1);
}

ChunkEncoder::~ChunkEncoder() { ZSTD_freeCCtx(static_cast<ZSTD_CCtx*>(cctx_)); }

void ChunkEncoder::Encode(const uint8_t* data, size_t size, bool allow_zstd,
                          v1::ChunkMessage* msg) {
  msg->set_raw_bytes(size);
  v1::Codec codec = v1::RAW;
  Encode(data, size, allow_zstd, &codec, msg->mutable_payload());
  msg->set_codec(codec);
}

void ChunkEncoder::Encode(const uint8_t* data, size_t size, bool allow_zstd, v1::Codec* codec,
                          std::string* payload) {
  bool try_zstd = allow_zstd && size >= options_.min_bytes;
  if (try_zstd && skip_remaining_ > 0) {
    --skip_remaining_;
    ++skipped_attempts_;
    try_zstd = false;
  }
  if (try_zstd && options_.probe_bytes > 0 && size >= 4 * options_.probe_bytes) {
    const size_t probe_limit = static_cast<size_t>(static_cast<double>(options_.probe_bytes) * options_.max_ratio);
    probe_out_.resize(probe_limit);
    size_t n = 0;
    if (!Compresses(data, options_.probe_bytes, probe_out_.data(), probe_limit, &n)) {
      ++probe_refusals_;
      try_zstd = false;
      skip_remaining_ = options_.retry_every > 0 ? options_.retry_every - 1 : 0;
    }
  }
  if (try_zstd) {
    // Capacity just below the break-even size: zstd stops with dstSize_tooSmall when the chunk
    // does not shrink enough, so the miss costs no extra buffer.
    const size_t limit = static_cast<size_t>(static_cast<double>(size) * options_.max_ratio);
    payload->resize(limit);
    size_t n = 0;
    if (Compresses(data, size, payload->data(), limit, &n)) {
      payload->resize(n);
      *codec = v1::ZSTD;
      return;
    }
    skip_remaining_ = options_.retry_every > 0 ? options_.retry_every - 1 : 0;
  }
  *codec = v1::RAW;
  payload->assign(reinterpret_cast<const char*>(data), size);
}

bool ChunkEncoder::Compresses(const uint8_t* data, size_t size, char* out, size_t limit, size_t* n) {
  auto* cctx = static_cast<ZSTD_CCtx*>(cctx_);
  ZSTD_CCtx_reset(cctx, ZSTD_reset_session_only);
  *n = ZSTD_compress2(cctx, out, limit, data, size);
  return !ZSTD_isError(*n) && *n < limit;
}

namespace {

struct FreeDCtx {
  void operator()(ZSTD_DCtx* d) const { ZSTD_freeDCtx(d); }
};

// This thread's decompression context; nullptr when there is no memory for one.
ZSTD_DCtx* ThreadDCtx() {
  thread_local std::unique_ptr<ZSTD_DCtx, FreeDCtx> dctx;
  if (dctx == nullptr) {
    dctx.reset(ZSTD_createDCtx());
    if (dctx != nullptr) ZSTD_DCtx_setParameter(dctx.get(), ZSTD_d_windowLogMax, ChunkDecoder::kWindowLogMax);
  }
  return dctx.get();
}

}  // namespace

Status ChunkDecoder::Decode(const v1::ChunkMessage& msg, uint64_t expected_bytes,
                            const std::string& where, AlignedBuffer* out) {
  if (msg.raw_bytes() != expected_bytes) {
    return DataLoss(where + ": message says " + std::to_string(msg.raw_bytes()) +
                    " raw bytes, the manifest says the chunk has " +
                    std::to_string(expected_bytes));
  }
  return Decode(msg.codec(), msg.payload(), expected_bytes, where, out);
}

Status ChunkDecoder::Decode(v1::Codec codec, const std::string& payload, uint64_t expected_bytes,
                            const std::string& where, AlignedBuffer* out) {
  switch (codec) {
    case v1::RAW: {
      if (payload.size() != expected_bytes) {
        return DataLoss(where + ": RAW payload has " + std::to_string(payload.size()) +
                        " bytes, expected " + std::to_string(expected_bytes));
      }
      *out = AlignedBuffer(expected_bytes);
      std::memcpy(out->data(), payload.data(), payload.size());
      return Status::Ok();
    }
    case v1::ZSTD: {
      const unsigned long long declared =
          ZSTD_getFrameContentSize(payload.data(), payload.size());
      if (declared == ZSTD_CONTENTSIZE_ERROR) {
        return DataLoss(where + ": payload is not a zstd frame");
      }
      if (declared != ZSTD_CONTENTSIZE_UNKNOWN && declared != expected_bytes) {
        return DataLoss(where + ": zstd frame declares " + std::to_string(declared) +
                        " bytes, expected " + std::to_string(expected_bytes));
      }
      // One byte of slack: a frame that would write more than expected fills it and is caught.
      AlignedBuffer buf(expected_bytes + 1);
      ZSTD_DCtx* dctx = ThreadDCtx();
      if (dctx == nullptr) return ResourceExhausted(where + ": no memory for a zstd decoder");
      ZSTD_DCtx_reset(dctx, ZSTD_reset_session_only);
      ZSTD_inBuffer in{payload.data(), payload.size(), 0};
      ZSTD_outBuffer o{buf.data(), expected_bytes + 1, 0};
      size_t r = 0;
      while (true) {
        const size_t in_before = in.pos, out_before = o.pos;
        r = ZSTD_decompressStream(dctx, &o, &in);
        if (ZSTD_isError(r)) {
          return DataLoss(where + ": zstd frame rejected: " + ZSTD_getErrorName(r));
        }
        if (o.pos > expected_bytes) {
          return DataLoss(where + ": zstd frame inflates beyond the expected " +
                          std::to_string(expected_bytes) + " bytes");
        }
        if (r == 0) break;                                           // frame complete
        if (in.pos == in_before && o.pos == out_before) break;       // no progress: truncated
      }
      if (r != 0) {
        return DataLoss(where + ": zstd frame is truncated after " + std::to_string(o.pos) +
                        " bytes");
      }
      if (in.pos != in.size) {
        return DataLoss(where + ": " + std::to_string(in.size - in.pos) +
                        " trailing bytes after the zstd frame");
      }
      if (o.pos != expected_bytes) {
        return DataLoss(where + ": zstd frame produced " + std::to_string(o.pos) +
                        " bytes, expected " + std::to_string(expected_bytes));
      }
      buf.Resize(expected_bytes);
      *out = std::move(buf);
      return Status::Ok();
    }
    default:
      return DataLoss(where + ": unknown codec " + std::to_string(static_cast<int>(codec)));
  }
}

}  // namespace shardcache::upstream
