// libshardcache: the trainer side of a node's shardcached.
//
//   auto client = shardcache::Client::Connect("/run/shardcache/shardcached.sock");
//   if (!client.ok()) { ... client.status() ... }
//   shardcache::LoaderOptions o;
//   o.dataset = "tokens-v3"; o.batch_size = 32; o.shuffle = shardcache::Shuffle::kBlock;
//   o.rank = 0; o.world_size = 8; o.drop_last = true;
//   auto loader = (*client)->OpenLoader(o);
//   while (auto batch = (*loader)->Next()) {     // Result<Batch>; OutOfRange at end of epoch
//     for (size_t i = 0; i < batch->size(); ++i) use(batch->sample_id(i), batch->sample(i));
//   }                                            // each Batch releases its slot when destroyed
//   shardcache::LoaderState s = (*loader)->state();   // resume: o.samples_consumed = s.samples_consumed
//
// Batches point into a shared-memory arena the daemon mapped for this connection: reading a
// sample copies nothing. A Batch is valid until it is destroyed or Release()d; its bytes are
// never overwritten before that. The arena has a fixed number of slots (HelloResponse), so a
// trainer that keeps every batch alive gets ResourceExhausted from Next() instead of a hang.
// Tar samples come with their fields: batch->field(i, "jpg") is a view of that member's bytes.
//
// Errors are Status / Result (common/status.h, installed beside this header); no exceptions.
// The library needs only libprotobuf-lite: no gRPC, no RocksDB.
//
// Latency: the daemon describes each loader's next batches in a shared-memory batch ring as
// soon as they are assembled (local protocol 3), so when the trainer computes longer than the
// daemon needs to assemble a batch, Next() finds it there: no system call, no daemon thread
// woken. Only a Next() that finds the ring empty asks the daemon over the socket and waits.
// Each batch described ahead holds an arena slot. Releases are written a few at a time: a
// released batch's slot returns to the daemon with the next write on its connection (at the
// latest after 4 releases, or with any other call), and the daemon does not answer releases
// (local protocol 4). This library speaks protocol 5: a daemon older than that refuses it
// with FailedPrecondition naming both versions.
//
// Processes: a connection belongs to the process that opened it. In a child made by fork()
// (a DataLoader worker), the inherited Client, Loaders and Batches stay valid to destroy but
// send nothing on the parent's socket: calls return FailedPrecondition, and the child connects
// with its own Client.
//
// Thread safety: a Client and its Loaders may be used from several threads; requests on one
// connection are serialized, and Next() calls on one Loader are serialized. A Batch may be read from any thread and destroyed on any thread.
// Objects may be destroyed in any order: a Loader stays open in the daemon until it and every
// Batch it returned are gone, and the connection until the last Loader and Batch are gone.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace shardcache {

inline constexpr char kDefaultSocketPath[] = "/run/shardcache/shardcached.sock";

enum class Shuffle { kNone = 0, kGlobal = 1, kBlock = 2 };

// "none" | "global" | "block".
Result<Shuffle> ParseShuffle(const std::string& name);

// What one loader reads: rank `rank` of `world_size` of epoch `epoch`'s order (the daemon's
// daemon/plan/rank_slice.h explains the cut in full). Every rank of a job gets the same number
// of samples, so every rank runs the same number of batches (DDP-safe).
struct LoaderOptions {
  std::string dataset;
  uint32_t batch_size = 32;
  uint64_t seed = 0;
  uint64_t epoch = 0;
  Shuffle shuffle = Shuffle::kNone;
  uint32_t rank = 0;
  uint32_t world_size = 1;
  // true: every batch of every rank is full; the tail of the epoch's order is dropped (the same
  // samples for all ranks). false: the last batch may be short, and a rank one sample short of
  // the others repeats the first sample of its own order, like torch's DistributedSampler
  // (at most world_size - 1 samples of an epoch are read twice).
  bool drop_last = false;
  // With drop_last = false: false gives every sample exactly once instead, and ranks that differ
  // by one sample (evaluation; not for DDP training, whose ranks must run equal batch counts).
  bool pad = true;
  // Resume point: samples of this rank already consumed in `epoch` after start_position
  // (LoaderState::samples_consumed).
  uint64_t samples_consumed = 0;
  // Resume on another world size: the global positions of the epoch's order every rank has
  // consumed (LoaderState::GlobalPosition of the old job's state); the ranks split the rest.
  uint64_t start_position = 0;
  // Block shuffle window in shards; 0 = the daemon's automatic size (which depends on the world
  // size: a job resumed on another world size passes the old loader's block_window_shards()).
  uint32_t block_window_shards = 0;
  // DataLoader-style workers: this loader reads batches worker, worker + num_workers, ... of the
  // rank's batches, so that taking one batch from each worker in turn gives the rank's order.
  uint32_t worker = 0;
  uint32_t num_workers = 1;
  // Tar datasets: describe each sample's fields (members) with its batch (Batch::field).
  bool fields = true;
  // Non-empty: refuse to open (FailedPrecondition naming both versions) unless the dataset is at
  // this version; a resume passes the version its state was saved with.
  std::string expect_version;
  // How long Next() lets the daemon wait for data; 0 = the daemon's default.
  uint32_t next_timeout_ms = 0;
  std::string job;  // informational
};

struct LoaderState {
  uint64_t epoch = 0;
  // The rank's resume point: samples of the rank consumed after start_position (for a worker's
  // loader, once the other workers' batches before its last one are consumed too).
  uint64_t samples_consumed = 0;
  uint64_t start_position = 0;
  uint32_t world_size = 1;
  // The global positions of the epoch every rank has consumed when all ranks stand at
  // samples_consumed (DDP ranks move in step): a resume point for any world size.
  uint64_t GlobalPosition(uint64_t dataset_samples) const {
    const uint64_t p = start_position + samples_consumed * world_size;
    return p < dataset_samples ? p : dataset_samples;
  }
};

// A read-only view of bytes in the arena.
struct ByteView {
  const uint8_t* data = nullptr;
  size_t size = 0;
  const uint8_t* begin() const { return data; }
  const uint8_t* end() const { return data + size; }
};

// One part of a sample (a WebDataset tar member): its name, the member name's extension
// ("jpg", "cls", "seg.png"), and its bytes.
struct Field {
  std::string_view name;
  ByteView bytes;
};

namespace client_internal {
struct Connection;
struct LoaderCore;
class Session;
}  // namespace client_internal
namespace sample_fields {
class FieldsView;
}  // namespace sample_fields

// One batch in shared memory. Move-only; destroying it (or Release()) returns its slot.
class Batch {
 public:
  Batch(Batch&&) noexcept;
  Batch& operator=(Batch&&) noexcept;
  Batch(const Batch&) = delete;
  Batch& operator=(const Batch&) = delete;
  ~Batch();

  size_t size() const { return ids_.size(); }
  uint64_t sample_id(size_t i) const { return ids_[i]; }
  const std::vector<uint64_t>& sample_ids() const { return ids_; }
  ByteView sample(size_t i) const { return {data_ + offsets_[i], static_cast<size_t>(lengths_[i])}; }
  // The whole payload; samples lie back to back in batch order.
  const uint8_t* data() const { return data_; }
  uint64_t payload_bytes() const { return payload_bytes_; }
  // > 0 when the payload is a dense [size(), record_bytes] block (fixed-size records).
  uint64_t record_bytes() const { return record_bytes_; }
  uint64_t seq() const { return seq_; }
  // How long the daemon waited for this batch's data (0 when it was prefetched).
  uint64_t wait_us() const { return wait_us_; }
  // The rank's resume point once this batch and every batch before it in the rank's order are
  // consumed (LoaderState::samples_consumed): what a DataLoader that merges several workers'
  // batches records after yielding this one.
  uint64_t samples_consumed_after() const { return consumed_after_; }

  // Fields of tar samples (LoaderOptions::fields): views into the batch, like sample(i).
  bool has_fields() const { return fields_ != nullptr; }
  // Sample i's WebDataset key; "" without fields.
  std::string_view key(size_t i) const;
  size_t field_count(size_t i) const;
  // Sample i's k-th field, in tar order. REQUIRES: k < field_count(i).
  Field field(size_t i, size_t k) const;
  // Sample i's field called `name`; nullopt when it has none.
  std::optional<ByteView> field(size_t i, std::string_view name) const;

  // Returns the slot now; the batch is empty afterwards. Idempotent.
  Status Release();

 private:
  friend class Loader;
  friend struct client_internal::LoaderCore;
  Batch() = default;

  std::shared_ptr<client_internal::LoaderCore> core_;  // keeps the loader open while the batch lives
  std::shared_ptr<client_internal::Connection> conn_;  // the connection (and arena) it came on
  uint64_t loader_id_ = 0;
  uint32_t slot_ = 0;
  bool held_ = false;
  const uint8_t* data_ = nullptr;
  uint64_t payload_bytes_ = 0;
  uint64_t record_bytes_ = 0;
  uint64_t seq_ = 0;
  uint64_t wait_us_ = 0;
  uint64_t consumed_after_ = 0;
  std::vector<uint64_t> ids_;
  std::vector<uint64_t> offsets_;
  std::vector<uint64_t> lengths_;
  std::unique_ptr<sample_fields::FieldsView> fields_;  // checked table in the slot, or null
};

class Loader {
 public:
  ~Loader();
  Loader(const Loader&) = delete;
  Loader& operator=(const Loader&) = delete;

  // The next batch of this rank in plan order. OutOfRange ("end of epoch") once the epoch is
  // done; ResourceExhausted when every arena slot is held by unreleased batches;
  // DeadlineExceeded when the data did not arrive within the timeout; Unavailable when the
  // daemon went away and did not come back within ClientOptions::reconnect_timeout_ms (when it
  // does, Next() continues the epoch on it after a pause).
  Result<Batch> Next();

  // Resume point, tracked locally: the samples Next() returned.
  LoaderState state() const;
  // The daemon's view: samples it handed to this client, which include the batches it has
  // described in the loader's batch ring and Next() has not returned yet (at most
  // ring_entries()). Resume from state().
  Result<LoaderState> QueryState();

  // This rank's samples in the epoch (from start_position; padding included).
  uint64_t samples_per_epoch() const;
  // Samples this loader delivers from its resume point (its worker's share).
  uint64_t loader_samples() const;
  uint64_t dataset_samples() const;
  uint64_t record_bytes() const;
  const std::string& version() const;
  // "records" | "tar" | "megatron".
  const std::string& format() const;
  // Megatron: the tokens' numpy dtype name ("uint16", "int32", ...); "" otherwise.
  const std::string& sample_dtype() const;
  // Block shuffle: the window the plan used (pass it back when resuming on another world size).
  uint32_t block_window_shards() const;
  const LoaderOptions& options() const;
  // Batches the daemon describes ahead at most (the size of the loader's batch ring).
  uint32_t ring_entries() const;

 private:
  friend class Client;
  explicit Loader(std::shared_ptr<client_internal::LoaderCore> core) : core_(std::move(core)) {}
  std::shared_ptr<client_internal::LoaderCore> core_;
};

struct ClientOptions {
  // When the daemon drops the connection (a restart, an upgrade, SIGTERM), keep trying to
  // reconnect for this long; each open loader then continues at the batch after the last one
  // Next() returned, on the same dataset version (FailedPrecondition if it changed), so the
  // trainer sees a pause, not an error. 0 = never reconnect: the loss is Unavailable.
  // Default: 60 s.
  uint32_t reconnect_timeout_ms = 60000;
};

// A checkpoint being saved through the node's daemon (write-behind): the bytes go straight to a
// file on the node's disk through fd(); Close() fsyncs it and returns once the daemon has made
// it durable under its name. The daemon uploads it in the background (Client::WaitUploaded).
// A writer destroyed or aborted before Close() leaves nothing behind. Not thread-safe.
class CheckpointWriter {
 public:
  ~CheckpointWriter();
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  // The writable descriptor (owned by the writer; -1 once closed).
  int fd() const { return fd_; }
  // Appends; a full disk is ResourceExhausted naming the checkpoint.
  Status Write(const void* data, size_t size);
  // fsync, then the daemon commits it under its name and queues the upload. The size saved.
  Result<uint64_t> Close();
  // Drops what was written.
  void Abort();

 private:
  friend class Client;
  CheckpointWriter(std::shared_ptr<client_internal::Connection> conn, std::string name, uint64_t handle, int fd)
      : conn_(std::move(conn)), name_(std::move(name)), handle_(handle), fd_(fd) {}
  std::shared_ptr<client_internal::Connection> conn_;
  std::string name_;
  uint64_t handle_;
  int fd_;
};

// One checkpoint as the daemon reports it.
struct CheckpointState {
  std::string name;
  std::string state;  // local | uploading | remote | failed
  uint64_t size = 0;
  uint64_t uploaded_bytes = 0;
  double upload_bytes_per_s = 0;
  double eta_s = 0;
  bool local = false;  // a copy is on the node
  std::string error;
};

class Client {
 public:
  // Connects, checks the protocol version and maps the arena. PermissionDenied when the daemon
  // refuses this uid; Unavailable when nobody listens at socket_path.
  static Result<std::unique_ptr<Client>> Connect(const std::string& socket_path = kDefaultSocketPath,
                                                 const ClientOptions& options = {});
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  Result<std::unique_ptr<Loader>> OpenLoader(const LoaderOptions& options);
  // The daemon's serve statistics, one JSON object.
  Result<std::string> Stats();

  // Starts saving checkpoint `name` ("run7/step1000/rank3.pt": relative, '/'-separated).
  Result<std::unique_ptr<CheckpointWriter>> Checkpoint(const std::string& name);
  // States of the checkpoints saved through this node ("" = all; NotFound for an unknown name).
  Result<std::vector<CheckpointState>> Checkpoints(const std::string& name = "");
  // Waits until `name` is committed upstream (OK), its upload failed for good (that error), or
  // timeout_ms passes (DeadlineExceeded saying how far it got).
  Status WaitUploaded(const std::string& name, uint32_t timeout_ms);
  // A read-only descriptor of checkpoint `name` (the caller closes it): the node's copy, else
  // read from the upstream first (resume on another node).
  Result<int> OpenCheckpoint(const std::string& name);

  uint64_t arena_bytes() const;
  uint32_t slot_count() const;
  uint64_t slot_bytes() const;
  // Start of the mapped arena (e.g. for cudaHostRegister once per connection). A reconnect
  // maps a new arena: batches from before it stay in the old one.
  const uint8_t* arena_data() const;

 private:
  explicit Client(std::shared_ptr<client_internal::Session> session) : session_(std::move(session)) {}
  std::shared_ptr<client_internal::Session> session_;
};

}  // namespace shardcache
