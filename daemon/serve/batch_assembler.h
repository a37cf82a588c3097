// Batch assembly: turns a list of global sample ids into one contiguous payload inside an arena
// slot, reading every chunk that covers those samples through a ChunkSource.
//
//   SampleLocator  — global sample id → (shard, byte offset, length). Records datasets need no
//                    I/O; other formats load each shard's sample index once, on first use,
//                    through ChunkSource::GetSampleIndex, and keep it (16 bytes per sample; a
//                    tar shard also keeps its members' ranges, names and the sample keys, for
//                    loaders that ask for fields: about 40 bytes per member plus the key).
//   BatchAssembler — collects the distinct chunks a batch needs, reads contiguous runs of them
//                    in parallel on a small pool of reader threads (a cold chunk can take a
//                    network round trip) with ChunkSource::ReadPieces: each sample's overlap
//                    with each chunk goes straight to its place in the slot (a cache reads
//                    only those bytes from NVMe, into the slot itself where aligned). Every
//                    payload byte is copied at most once; no chunk is fetched twice for one
//                    batch. Samples are laid out
//                    back to back in batch order, so a records batch is a dense
//                    [B, record_bytes] block. On request, a field table
//                    (common/sample_fields.h) follows the payload in the slot.
//   It also runs fire-and-forget warm reads (prefetch priority; ranges of chunks, or the pieces
//   of a few samples) for the prefetcher, at most `max_warm_inflight` at a time.
//
// Thread safety: SampleLocator and BatchAssembler are safe for concurrent use; AssembleAsync()
// never waits for I/O (a batch whose chunks are all in memory is copied on the caller's thread).
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/mutex.h"
#include "common/sample_fields.h"
#include "common/status.h"
#include "daemon/source/chunk_source.h"

namespace shardcache::serve {

class SampleLocator {
 public:
  struct Extent {
    uint32_t shard = 0;
    uint64_t offset = 0;  // in the shard file
    uint64_t length = 0;
  };

  SampleLocator(ChunkSource& source, DatasetPtr dataset);

  const DatasetPtr& dataset() const { return dataset_; }
  uint64_t total_samples() const { return first_id_.back(); }
  // > 0 when every sample is a fixed-size record.
  uint64_t record_bytes() const { return record_bytes_; }
  // OutOfRange for ids past the dataset; errors from loading a sample index otherwise (naming
  // the shard).
  Result<Extent> Locate(uint64_t sample_id);
  // Loads the sample indexes of the shards of `ids` that are not loaded yet, up to
  // kParallelIndexLoads at a time: a global-shuffle batch touches as many shards as it has
  // samples, and loading them one after another costs one upstream round trip each. The first
  // error (naming its shard) when one fails. Records datasets need no index: Ok at once.
  static constexpr size_t kParallelIndexLoads = 16;
  Status LoadIndexesOf(std::span<const uint64_t> ids);
  // True for tar datasets: their samples have fields (members) and keys.
  bool has_fields() const { return has_fields_; }

  // Collects the field table of one batch (sample_fields.h).
  class FieldsBuilder {
   public:
    uint64_t bytes() const {
      return sample_fields::TableBytes(samples_.size(), members_.size(), names_.size());
    }
    // Writes the table to dest. REQUIRES: dest has bytes() bytes.
    void WriteTo(uint8_t* dest) const;
    // Room for `samples` samples of a few members and a short key each.
    void Reserve(size_t samples) {
      samples_.reserve(samples);
      members_.reserve(samples * 3);
      names_.reserve(samples * 24);
    }

   private:
    friend class SampleLocator;
    // Where `name` is in names_, added on first use. Names are the strings of shard indexes:
    // the same string object is found by its address first.
    uint32_t NameOffset(const std::string& name);

    std::vector<sample_fields::SampleFields> samples_;
    std::vector<sample_fields::MemberField> members_;
    std::string names_;
    std::vector<std::pair<const std::string*, uint32_t>> name_offsets_;
  };
  // Appends sample `sample_id`'s key and members, its bytes placed at `payload_offset` of the
  // payload. FailedPrecondition unless has_fields(); errors as Locate otherwise.
  Status AppendFields(uint64_t sample_id, uint64_t payload_offset, FieldsBuilder* out);

 private:
  struct ShardIndex {
    std::vector<uint64_t> offsets;
    std::vector<uint64_t> lengths;
    // Tar only. Sample i's members are members[first_member[i], first_member[i + 1]), with
    // offsets relative to the sample's start; member names index `names` (the distinct
    // extensions of the shard).
    struct Member {
      uint64_t offset;
      uint64_t length;
      uint32_t name;
    };
    std::vector<uint32_t> first_member;
    std::vector<Member> members;
    std::vector<std::string> names;
    std::vector<std::string> keys;
  };
  // (shard, index within the shard) of a sample id; OutOfRange past the dataset.
  Result<std::pair<uint32_t, uint64_t>> ShardOf(uint64_t sample_id) const;
  // Fills the tar member tables of `si` from `idx`, checking them against the sample ranges.
  Status LoadMembers(const v1::SampleIndex& idx, uint32_t shard, ShardIndex* si) const;
  // The shard's index, loaded on first use. Owned by the locator for its lifetime; lock-free
  // once loaded (every sample of every batch asks).
  Result<const ShardIndex*> IndexOf(uint32_t shard);

  ChunkSource& source_;
  const DatasetPtr dataset_;
  uint64_t record_bytes_ = 0;
  bool has_fields_ = false;
  std::vector<uint64_t> first_id_;  // first_id_[s] = first global id of shard s; back() = N

  Mutex mu_;
  std::vector<std::unique_ptr<const ShardIndex>> indexes_ GUARDED_BY(mu_);  // owners
  std::unique_ptr<std::atomic<const ShardIndex*>[]> loaded_;  // published after indexes_ holds it
};

struct AssembledBatch {
  std::vector<uint64_t> sample_ids;
  std::vector<uint64_t> offsets;  // relative to the payload start
  std::vector<uint64_t> lengths;
  uint64_t payload_bytes = 0;
  uint64_t chunks_read = 0;
  // The field table after the payload (relative to the payload start); 0 bytes = none.
  uint64_t fields_offset = 0;
  uint64_t fields_bytes = 0;
};

struct BatchAssemblerOptions {
  // Threads that read chunks for batches and warm-ups. Default: 128 (cold reads wait on the
  // network, not the CPU: a long link with a small window needs tens of streams busy, each
  // whole chunk on its own, with more work queued behind them so that the upstream's stream
  // controller sees demand).
  uint32_t read_threads = 128;
  // Warm reads in flight at once, over all loaders; capped at three quarters of the read
  // threads so that demand reads always find a free thread. Default: 96.
  uint32_t max_warm_inflight = 96;
  // Deadline of one batch's reads. Default: 120 s.
  uint32_t read_timeout_ms = 120000;
};

class BatchAssembler {
 public:
  BatchAssembler(ChunkSource& source, BatchAssemblerOptions options = {});
  ~BatchAssembler();  // waits for reads in flight
  BatchAssembler(const BatchAssembler&) = delete;
  BatchAssembler& operator=(const BatchAssembler&) = delete;

  ChunkSource& source() { return source_; }

  // Starts assembling `ids` into [dest, dest + dest_bytes); `done` runs exactly once with the
  // outcome — on a pool thread, or on the caller before AssembleAsync returns when no read
  // needs the pool: every chunk is in memory (ChunkSource::ReadPiecesFromMemory; the batch is
  // copied right there), or the batch fails before any read (a sample cannot be located: the
  // locator's error; the payload does not fit: ResourceExhausted naming the sizes). A chunk
  // that cannot be read: the source's error. `locator` is used only during the call. With
  // `fields` and a locator that has_fields(), the batch's field table is written after the
  // payload (it must fit the slot too). `whole_chunks` false: chunks no tier holds are not
  // fetched whole, only the blocks the samples cover (ReadOptions::whole_chunks).
  using AssembleDone = std::function<void(Status, AssembledBatch)>;
  void AssembleAsync(SampleLocator& locator, std::vector<uint64_t> ids, uint8_t* dest,
                     uint64_t dest_bytes, AssembleDone done, bool fields = false, bool whole_chunks = true);

  // Queues a prefetch-priority ChunkSource::Prefetch of chunks [first, first + count) of
  // `shard` (it warms the cache tiers below; a cache fetches only what it lacks, as one
  // upstream range). True without queueing when the source already holds them all
  // (ChunkSource::Holds); false without queueing when max_warm_inflight are in flight.
  // `still_wanted` is asked when the read is about to start; false drops it.
  bool TryWarm(const DatasetPtr& dataset, uint32_t shard, uint64_t first, uint64_t count,
               std::function<bool()> still_wanted = {});
  // Queues a prefetch-priority read of `pieces` of `shard` (their dest is ignored) that only
  // fills the tiers below: a cache fetches the blocks they cover and keeps them as runs
  // (ChunkSource::ReadPieces with whole_chunks false). True when taken: `landed` is then told
  // of every byte of the pieces exactly once — at once when the source holds them all already
  // (ChunkSource::HoldsPieces), else on a pool thread piece by piece as they land, and the rest
  // when the read ends or is dropped (`still_wanted`, asked when it is about to start, said
  // no). False, without queueing and telling nothing, when max_warm_inflight are in flight.
  bool TryWarmPieces(const DatasetPtr& dataset, uint32_t shard, std::vector<ChunkPiece> pieces,
                     std::function<bool()> still_wanted, std::function<void(uint64_t)> landed);
  uint32_t warm_inflight() const;

 private:
  struct PieceRun;
  // Locates the samples, fills `out`'s layout and groups the pieces into runs.
  Status Plan(SampleLocator& locator, std::span<const uint64_t> ids, uint8_t* dest,
              uint64_t dest_bytes, bool fields, AssembledBatch* out, std::vector<PieceRun>* runs);
  void Submit(std::function<void()> task, bool demand);
  // One of the max_warm_inflight warm reads: false when they are all taken.
  bool TakeWarmSlot();
  void ReleaseWarmSlot();
  ReadOptions WarmReadOptions() const;
  void WorkerLoop();

  ChunkSource& source_;
  const BatchAssemblerOptions options_;

  mutable Mutex mu_;
  CondVar work_;
  std::deque<std::function<void()>> demand_ GUARDED_BY(mu_);  // served before warm_
  std::deque<std::function<void()>> warm_ GUARDED_BY(mu_);
  uint32_t warm_inflight_ GUARDED_BY(mu_) = 0;
  bool stop_ GUARDED_BY(mu_) = false;
  std::vector<std::thread> workers_;
};

}  // namespace shardcache::serve
