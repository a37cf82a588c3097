// libshardcache implementation: framing over the Unix socket, the mapped arena and batch
// rings, and the shared ownership that keeps a loader open while its batches live.
#include "shardcache/client.h"

#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <vector>

#include "client/src/connection.h"
#include "common/mutex.h"
#include "common/sample_fields.h"
#include "shardcache/batch_ring.h"
#include "shardcache/local.pb.h"

namespace shardcache {
namespace client_internal {

// The daemon-side loader stays open until the Loader and all its Batches are gone.
//
// A loader lives on one connection at a time. When the daemon drops it (a restart, an upgrade)
// Next() reopens the loader on the Session's new connection at the batch after the last one it
// returned, so the trainer sees the epoch go on after a pause, every sample once. Batches
// already returned keep their old connection (their arena mapping stays valid) and release
// nothing into the new daemon's slots.
struct LoaderCore {
  std::shared_ptr<Session> session;
  LoaderOptions options;  // as the trainer opened it (state() reports these)
  mutable Mutex mu;
  uint64_t consumed GUARDED_BY(mu) = 0;  // the rank's resume point after the last batch taken

  // The rest is set by Open() and changed only under next_mu (one Next() at a time).
  Mutex next_mu;
  std::shared_ptr<Connection> conn;
  uint64_t id = 0;
  std::string version;
  uint64_t samples_per_epoch = 0;
  uint64_t loader_samples = 0;
  uint64_t dataset_samples = 0;
  uint64_t record_bytes = 0;
  std::string format;
  std::string sample_dtype;
  uint32_t block_window_shards = 0;
  uint64_t opened_at = 0;      // the rank position this daemon-side loader started at
  uint64_t batches_taken = 0;  // batches Next() returned from it
  batch_ring::RingReader ring;  // the loader's batch ring, mapped read-only
  uint64_t next_entry = 0;      // the next ring entry to read

  ~LoaderCore() {
    if (conn != nullptr && id != 0) {
      v1::LocalRequest req;
      req.mutable_close_loader()->set_loader_id(id);
      v1::LocalResponse resp;
      (void)conn->Call(req, &resp);  // a lost connection closed it already
    }
  }

  // Opens the daemon-side loader of `o` on `on` and maps its ring (replacing an earlier one).
  Status Open(const std::shared_ptr<Connection>& on, const LoaderOptions& o) {
    v1::LocalRequest req;
    auto* r = req.mutable_open_loader();
    r->set_dataset(o.dataset);
    r->set_batch_size(o.batch_size);
    r->set_seed(o.seed);
    r->set_epoch(o.epoch);
    r->set_shuffle(static_cast<v1::ShuffleMode>(o.shuffle));
    r->set_rank(o.rank);
    r->set_world_size(o.world_size);
    r->set_drop_last(o.drop_last);
    r->set_samples_consumed(o.samples_consumed);
    r->set_job(o.job);
    r->set_block_window_shards(o.block_window_shards);
    r->set_batch_ring(true);
    r->set_uneven(!o.pad);
    r->set_start_position(o.start_position);
    r->set_worker(o.worker);
    r->set_num_workers(o.num_workers);
    r->set_fields(o.fields);
    r->set_expect_version(o.expect_version);
    v1::LocalResponse resp;
    int ring_fd = -1;
    Status s = on->Call(req, &resp, &ring_fd);
    if (!s.ok()) {
      if (ring_fd >= 0) close(ring_fd);
      return s.WithContext("opening a loader on '" + o.dataset + "'");
    }
    const auto& ol = resp.open_loader();
    conn = on;
    id = ol.loader_id();
    version = ol.version();
    samples_per_epoch = ol.samples_per_epoch();
    loader_samples = ol.loader_samples();
    dataset_samples = ol.dataset_samples();
    record_bytes = ol.record_bytes();
    format = ol.format();
    sample_dtype = ol.sample_dtype();
    block_window_shards = ol.block_window_shards();
    opened_at = o.samples_consumed;
    batches_taken = 0;
    next_entry = 0;
    ring = {};
    // Every byte the client reads must lie in the file: a shorter one would fault (SIGBUS).
    auto mapped = batch_ring::RingReader::Map(ring_fd, ol.ring_bytes(), ol.ring_entries(), o.batch_size);
    if (!mapped.ok()) return mapped.status().WithContext("loader " + std::to_string(id));  // ~LoaderCore closes it
    ring = std::move(*mapped);
    return Status::Ok();
  }

  // After the daemon dropped the connection: the same loader on the Session's new connection,
  // at the batch after the last one returned. A worker's loader reads every num_workers-th batch
  // of the rank, so its next batch lies num_workers batches on per batch taken.
  Status Reopen() {
    SC_ASSIGN_OR_RETURN(auto fresh, session->Replace(conn));
    LoaderOptions o = options;
    o.samples_consumed = opened_at + batches_taken * std::max(1u, o.num_workers) * uint64_t{o.batch_size};
    o.expect_version = version;                 // never continue an epoch on another version
    o.block_window_shards = block_window_shards;  // nor on another plan
    return Open(fresh, o).WithContext("resuming after shardcached restarted");
  }

  // One Next() on the current connection.
  Result<Batch> NextOnce(Batch b) REQUIRES(next_mu);
};

}  // namespace client_internal

using client_internal::Connection;
using client_internal::LoaderCore;
using client_internal::Session;

Result<Shuffle> ParseShuffle(const std::string& name) {
  if (name == "none") return Shuffle::kNone;
  if (name == "global") return Shuffle::kGlobal;
  if (name == "block") return Shuffle::kBlock;
  return InvalidArgument("shuffle '" + name + "' is not one of none|global|block");
}

// ---- Batch

Batch::Batch(Batch&& o) noexcept { *this = std::move(o); }

Batch& Batch::operator=(Batch&& o) noexcept {
  if (this != &o) {
    (void)Release();
    core_ = std::move(o.core_);
    conn_ = std::move(o.conn_);
    loader_id_ = o.loader_id_;
    slot_ = o.slot_;
    held_ = o.held_;
    data_ = o.data_;
    payload_bytes_ = o.payload_bytes_;
    record_bytes_ = o.record_bytes_;
    seq_ = o.seq_;
    wait_us_ = o.wait_us_;
    consumed_after_ = o.consumed_after_;
    ids_ = std::move(o.ids_);
    offsets_ = std::move(o.offsets_);
    lengths_ = std::move(o.lengths_);
    fields_ = std::move(o.fields_);
    o.held_ = false;
    o.data_ = nullptr;
    o.ids_.clear();
  }
  return *this;
}

Batch::~Batch() { (void)Release(); }

Status Batch::Release() {
  if (!held_) return Status::Ok();
  held_ = false;
  v1::LocalRequest req;
  req.mutable_release_batch()->set_loader_id(loader_id_);
  req.mutable_release_batch()->set_slot(slot_);
  req.mutable_release_batch()->set_no_reply(true);
  conn_->QueueRelease(req);  // nothing when that daemon is gone: its successor has other slots
  conn_.reset();
  core_.reset();
  data_ = nullptr;
  ids_.clear();
  offsets_.clear();
  lengths_.clear();
  fields_.reset();
  payload_bytes_ = 0;
  return Status::Ok();
}

std::string_view Batch::key(size_t i) const { return fields_ ? fields_->key(i) : std::string_view(); }

size_t Batch::field_count(size_t i) const { return fields_ ? fields_->member_count(i) : 0; }

Field Batch::field(size_t i, size_t k) const {
  const auto& m = fields_->member(i, static_cast<uint32_t>(k));
  return {fields_->name(m), {data_ + m.offset, static_cast<size_t>(m.length)}};
}

std::optional<ByteView> Batch::field(size_t i, std::string_view name) const {
  for (size_t k = 0; k < field_count(i); ++k) {
    Field f = field(i, k);
    if (f.name == name) return f.bytes;
  }
  return std::nullopt;
}

// ---- Loader

Loader::~Loader() = default;

Result<Batch> Loader::Next() {
  MutexLock next_lock(&core_->next_mu);
  // A forked child reading its parent's ring would take the very batches the parent takes.
  if (core_->conn->Inherited()) return Connection::InheritedError();
  // A daemon may go away again right after the first reconnect: a few rounds, each bounded by
  // the session's reconnect timeout.
  for (int round = 0;; ++round) {
    Batch b;
    b.core_ = core_;
    Result<Batch> got = core_->NextOnce(std::move(b));
    if (got.ok() || !core_->conn->Broken() || round == 3) return got;
    Status reopened = core_->Reopen();
    if (!reopened.ok()) return got.status().code() == StatusCode::kUnavailable ? reopened : got.status();
  }
}

Result<Batch> LoaderCore::NextOnce(Batch b) {
  LoaderCore& c = *this;
  const uint64_t i = c.next_entry;
  uint64_t wait_us = 0;
  if (c.ring.published() <= i) {
    // Nothing described yet: ask the daemon to answer once entry i is there (it publishes the
    // entry before it answers).
    v1::LocalRequest req;
    auto* nb = req.mutable_next_batch();
    nb->set_loader_id(c.id);
    nb->set_timeout_ms(c.options.next_timeout_ms);
    nb->set_ring(true);
    nb->set_ring_index(i);
    v1::LocalResponse resp;
    SC_RETURN_IF_ERROR(c.conn->Call(req, &resp));
    if (resp.next_batch().end_of_epoch()) return OutOfRange("end of epoch");
    wait_us = resp.next_batch().wait_us();
  }
  batch_ring::BatchDescription e;
  SC_RETURN_IF_ERROR(c.ring.Read(i, &e).WithContext("loader " + std::to_string(c.id)));
  const Connection& conn = *c.conn;
  if (e.slot >= conn.slot_count || e.payload_bytes > conn.slot_bytes) {
    return DataLoss("shardcached sent an inconsistent batch description");
  }
  const uint8_t* slot_data = conn.arena + uint64_t{e.slot} * conn.slot_bytes;
  if (e.fields_bytes > 0) {
    if (e.fields_offset < e.payload_bytes || e.fields_offset > conn.slot_bytes ||
        e.fields_bytes > conn.slot_bytes - e.fields_offset) {
      return DataLoss("shardcached placed a field table outside its slot");
    }
    b.fields_ = std::make_unique<sample_fields::FieldsView>();
    if (!b.fields_->Parse(slot_data + e.fields_offset, e.fields_bytes, static_cast<uint32_t>(e.ids.size()),
                          e.offsets.data(), e.lengths.data())) {
      return DataLoss(std::string("shardcached sent an inconsistent field table: ") + b.fields_->error());
    }
  }
  b.ids_ = std::move(e.ids);
  b.offsets_ = std::move(e.offsets);
  b.lengths_ = std::move(e.lengths);
  c.next_entry = i + 1;
  ++c.batches_taken;
  b.conn_ = c.conn;
  b.loader_id_ = c.id;
  b.slot_ = e.slot;
  b.held_ = true;
  b.data_ = slot_data;
  b.payload_bytes_ = e.payload_bytes;
  b.record_bytes_ = c.record_bytes;
  b.seq_ = e.batch_seq;
  b.wait_us_ = wait_us;
  b.consumed_after_ = e.rank_consumed;
  {
    MutexLock l(&c.mu);
    c.consumed = e.rank_consumed;
  }
  return b;
}

LoaderState Loader::state() const {
  LoaderState s;
  s.epoch = core_->options.epoch;
  s.start_position = core_->options.start_position;
  s.world_size = core_->options.world_size;
  MutexLock l(&core_->mu);
  s.samples_consumed = core_->consumed;
  return s;
}

Result<LoaderState> Loader::QueryState() {
  v1::LocalRequest req;
  v1::LocalResponse resp;
  {
    MutexLock next_lock(&core_->next_mu);
    req.mutable_loader_state()->set_loader_id(core_->id);
    SC_RETURN_IF_ERROR(core_->conn->Call(req, &resp));
  }
  LoaderState s = state();
  s.epoch = resp.loader_state().epoch();
  s.samples_consumed = resp.loader_state().samples_consumed();
  return s;
}

uint64_t Loader::samples_per_epoch() const { return core_->samples_per_epoch; }
uint64_t Loader::loader_samples() const { return core_->loader_samples; }
const std::string& Loader::format() const { return core_->format; }
const std::string& Loader::sample_dtype() const { return core_->sample_dtype; }
uint32_t Loader::block_window_shards() const { return core_->block_window_shards; }
uint64_t Loader::dataset_samples() const { return core_->dataset_samples; }
uint64_t Loader::record_bytes() const { return core_->record_bytes; }
const std::string& Loader::version() const { return core_->version; }
const LoaderOptions& Loader::options() const { return core_->options; }
uint32_t Loader::ring_entries() const { return core_->ring.entries(); }

// ---- Client

Result<std::unique_ptr<Client>> Client::Connect(const std::string& socket_path, const ClientOptions& options) {
  SC_ASSIGN_OR_RETURN(auto conn, Connection::Open(socket_path));
  return std::unique_ptr<Client>(
      new Client(std::make_shared<client_internal::Session>(socket_path, options.reconnect_timeout_ms, std::move(conn))));
}

Client::~Client() = default;

Result<std::unique_ptr<Loader>> Client::OpenLoader(const LoaderOptions& o) {
  auto core = std::make_shared<LoaderCore>();
  core->session = session_;
  core->options = o;
  MutexLock next_lock(&core->next_mu);
  std::shared_ptr<Connection> conn = session_->current();
  Status s = core->Open(conn, o);
  if (!s.ok() && conn->Broken()) {  // the daemon restarted since the last call: once more on its successor
    SC_ASSIGN_OR_RETURN(conn, session_->Replace(conn));
    s = core->Open(conn, o);
  }
  if (!s.ok()) return s;
  {
    MutexLock l(&core->mu);  // not shared yet; taken for the analysis
    core->consumed = std::min(o.samples_consumed, core->samples_per_epoch);
  }
  return std::unique_ptr<Loader>(new Loader(std::move(core)));
}

Result<std::string> Client::Stats() {
  v1::LocalRequest req;
  req.mutable_stats();
  v1::LocalResponse resp;
  SC_RETURN_IF_ERROR(session_->Call(req, &resp));
  return resp.stats().json();
}

uint64_t Client::arena_bytes() const { return session_->current()->arena_bytes; }
uint32_t Client::slot_count() const { return session_->current()->slot_count; }
uint64_t Client::slot_bytes() const { return session_->current()->slot_bytes; }
const uint8_t* Client::arena_data() const { return session_->current()->arena; }

}  // namespace shardcache
