// Batch ring: the shared memory in which shardcached describes a loader's next batches to its
// client (local protocol 3), so that a trainer whose batch is ready takes it with no system
// call and without waking a daemon thread. Its layout, the daemon's writer and the client's
// reader, in one place beside local.proto.
//
// One sealed memfd per loader, handed over with the OpenLoaderResponse (SCM_RIGHTS). Only the
// daemon writes it; the client maps it read-only. The daemon never reads anything back from it
// (it keeps its own count of what it published), so a client that scribbles on its mapping can
// only confuse itself.
//
//   offset 0                     RingHeader (64 bytes)
//   64 + (i % entries) * stride  entry i: RingEntry (64 bytes), then `samples` RingSample
//
// Entry i describes the i-th batch the daemon published for the loader; `published` counts
// them. The daemon writes entry i into a place only after the batch that used it before
// (i - entries) was released, and the client reads batches in order before it releases them,
// so a well-behaved client never sees an entry change while it reads it. Each entry still
// carries its index, stored last with release order and checked by the reader before and after
// it copies the entry (a seqlock), so a torn entry is detected rather than used.
//
// The client waits for an entry that is not published yet with a NextBatch request carrying
// `ring_index` (local.proto); the answer comes once the entry is published, or says end of
// epoch, or carries the error that stopped the loader.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "common/status.h"

namespace shardcache::batch_ring {

inline constexpr uint32_t kMagic = 0x52424353;  // "SCBR", little-endian
inline constexpr uint32_t kLayoutVersion = 1;
// RingEntry::index while the daemon writes the entry.
inline constexpr uint64_t kWriting = ~uint64_t{0};
// A ring larger than this is refused (a batch_size far beyond any slot).
inline constexpr uint64_t kMaxRingBytes = 64ull << 20;

static_assert(std::atomic<uint64_t>::is_always_lock_free, "the ring's counters are shared between processes");

struct RingHeader {
  uint32_t magic;
  uint32_t layout_version;
  uint32_t entries;      // places in the ring
  uint32_t max_samples;  // samples an entry can describe (the loader's batch size)
  uint64_t stride;       // bytes from one entry to the next
  std::atomic<uint64_t> published;  // entries published so far; only grows
  uint64_t reserved[4];
};
static_assert(sizeof(RingHeader) == 64);

// The fields after batch_seq came with local protocol 5 in what were reserved, zeroed bytes, so
// the layout version did not change.
struct RingEntry {
  std::atomic<uint64_t> index;  // the entry's index once complete; kWriting while written
  uint32_t slot;                // arena slot holding the payload
  uint32_t samples;             // RingSample records that follow
  uint64_t payload_bytes;
  uint64_t batch_seq;
  // The rank's resume point once the trainer has this batch and every batch before it
  // (daemon/plan/rank_slice.h, RankConsumedAfter): what LoaderState reports.
  uint64_t rank_consumed;
  // The batch's field table (common/sample_fields.h), from the payload start; 0 bytes = none.
  uint64_t fields_offset;
  uint64_t fields_bytes;
  uint64_t reserved;
};
static_assert(sizeof(RingEntry) == 64);

struct RingSample {
  uint64_t id;      // global sample id
  uint64_t offset;  // from the start of the payload
  uint64_t length;
};
static_assert(sizeof(RingSample) == 24);

inline constexpr uint64_t Stride(uint32_t max_samples) {
  return (sizeof(RingEntry) + uint64_t{max_samples} * sizeof(RingSample) + 63) / 64 * 64;
}
inline constexpr uint64_t RingBytes(uint32_t entries, uint32_t max_samples) {
  return sizeof(RingHeader) + uint64_t{entries} * Stride(max_samples);
}
inline constexpr uint64_t EntryOffset(uint64_t index, uint32_t entries, uint64_t stride) {
  return sizeof(RingHeader) + (index % entries) * stride;
}

// An entry's fields but its samples (see RingEntry).
struct EntryHead {
  uint32_t slot = 0;
  uint64_t payload_bytes = 0;
  uint64_t batch_seq = 0;
  uint64_t rank_consumed = 0;
  uint64_t fields_offset = 0;
  uint64_t fields_bytes = 0;
};

// One batch as its entry describes it.
struct BatchDescription : EntryHead {
  std::vector<uint64_t> ids;      // global sample ids
  std::vector<uint64_t> offsets;  // from the payload start
  std::vector<uint64_t> lengths;
};

// The daemon's side: a sealed memfd of RingBytes(entries, max_samples), mapped read-write here
// and handed to the client, which maps it read-only. Publish() writes the next entry and then
// advances `published`; the writer keeps its own count and never reads the shared memory back.
//
// Thread safety: Publish() calls must be serialized by the caller; fd() and the sizes are
// immutable.
class RingWriter {
 public:
  // InvalidArgument when entries or max_samples is 0 or the ring would exceed kMaxRingBytes;
  // ResourceExhausted / Internal when memfd, sealing or mmap fail.
  static Result<std::unique_ptr<RingWriter>> Create(uint32_t entries, uint32_t max_samples);
  ~RingWriter();
  RingWriter(const RingWriter&) = delete;
  RingWriter& operator=(const RingWriter&) = delete;

  int fd() const { return fd_; }
  uint64_t bytes() const { return bytes_; }
  uint32_t entries() const { return entries_; }
  uint32_t max_samples() const { return max_samples_; }
  uint64_t published() const { return published_; }

  // Describes a batch (`head`, and per sample its id, payload offset and length) as entry
  // published() and publishes it.
  // REQUIRES: the three spans have the same size, at most max_samples(); the batch of entry
  // published() - entries() was released (its place is reused).
  void Publish(const EntryHead& head, std::span<const uint64_t> ids, std::span<const uint64_t> offsets,
               std::span<const uint64_t> lengths);

 private:
  RingWriter() = default;

  int fd_ = -1;
  uint8_t* base_ = nullptr;
  uint64_t bytes_ = 0;
  uint32_t entries_ = 0;
  uint32_t max_samples_ = 0;
  uint64_t stride_ = 0;
  uint64_t published_ = 0;
};

// The client's side: the ring mapped read-only.
//
// Thread safety: const methods may be called concurrently; Map and destruction are exclusive.
class RingReader {
 public:
  RingReader() = default;
  ~RingReader();
  RingReader(RingReader&& o) noexcept { *this = std::move(o); }
  RingReader& operator=(RingReader&& o) noexcept;

  // Maps the ring `fd` (closed here, whatever the outcome) of `bytes` bytes, as announced by
  // the OpenLoaderResponse, and checks its header: `entries` places of at least `min_samples`
  // samples. DataLoss when the ring is missing, short or inconsistent.
  static Result<RingReader> Map(int fd, uint64_t bytes, uint32_t entries, uint32_t min_samples);

  bool mapped() const { return base_ != nullptr; }
  uint32_t entries() const { return entries_; }
  // Entries the daemon has published so far (acquire: their contents are visible).
  uint64_t published() const;
  // Copies entry i into *out (a seqlock read). DataLoss when entry i is
  // not published, was overwritten (the reader fell more than entries() behind), changed
  // while it was read, or describes samples outside its payload.
  Status Read(uint64_t i, BatchDescription* out) const;

 private:
  const uint8_t* base_ = nullptr;
  uint64_t bytes_ = 0;
  uint32_t entries_ = 0;
  uint32_t max_samples_ = 0;
  uint64_t stride_ = 0;
};

}  // namespace shardcache::batch_ring
