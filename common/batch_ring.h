// Batch ring: the layout of the shared memory in which shardcached describes a loader's next
// batches to its client (local protocol 3), so that a trainer whose batch is ready takes it
// with no system call and without waking a daemon thread.
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

}  // namespace shardcache::batch_ring
