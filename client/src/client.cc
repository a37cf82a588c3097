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
#include <mutex>
#include <vector>

#include "common/batch_ring.h"
#include "common/sample_fields.h"
#include "shardcache/local.pb.h"

namespace shardcache {
namespace client_internal {

constexpr uint32_t kProtocolVersion = 5;
constexpr uint32_t kMaxMessageBytes = 16u << 20;
constexpr uint32_t kMaxUnsentReleases = 4;

// One socket and one arena mapping.
//
// The daemon answers requests in order, one response each, except releases sent with
// no_reply (protocol 4). Besides plain calls (send, wait for the answer) the connection queues
// those releases: they are written together with the next call, or once kMaxUnsentReleases
// wait. Every write wakes a daemon thread, and on a busy node that thread can take the CPU from
// the trainer, so a trainer pays one wake-up per few batches instead of one per batch. With no
// answers to releases, the only response in flight is the current call's, and a descriptor
// that comes with it is that call's. Everything is serialized by mu.
struct Connection {
  int fd = -1;
  pid_t owner = ::getpid();  // a forked child must not talk on its parent's socket
  const uint8_t* arena = nullptr;
  uint64_t arena_bytes = 0;
  uint32_t slot_count = 0;
  uint64_t slot_bytes = 0;

  std::mutex mu;
  bool broken = false;           // GUARDED_BY(mu): every call fails fast
  std::string unsent;            // GUARDED_BY(mu): queued release frames
  uint32_t unsent_releases = 0;  // GUARDED_BY(mu)
  std::vector<uint8_t> in = std::vector<uint8_t>(64 << 10);  // GUARDED_BY(mu): read, not yet parsed
  size_t in_begin = 0, in_end = 0;                            // GUARDED_BY(mu)

  ~Connection() {
    if (arena != nullptr) munmap(const_cast<uint8_t*>(arena), arena_bytes);
    if (fd >= 0) close(fd);
  }

  // Sends req (after the queued releases) and reads its response; *received_fd gets a
  // descriptor passed with it (or -1).
  Status Call(const v1::LocalRequest& req, v1::LocalResponse* resp, int* received_fd = nullptr) {
    if (Inherited()) return InheritedError();
    std::lock_guard<std::mutex> l(mu);
    if (broken) return Unavailable("connection to shardcached was lost");
    AppendLocked(req);
    Status send_error = FlushLocked();
    // After a failed send, a response may still be waiting: a daemon that refuses a peer answers
    // PermissionDenied before it closes, and that answer says more than EPIPE.
    Status s = ReceiveLocked(resp, received_fd);
    if (!send_error.ok() || !s.ok()) broken = true;
    if (!s.ok()) return send_error.ok() ? s : send_error;
    return StatusOf(*resp);
  }

  // Queues a ReleaseBatch (sent with no_reply: nothing to wait for, nothing to read).
  void QueueRelease(const v1::LocalRequest& req) {
    if (Inherited()) return;  // the parent releases its own batches
    std::lock_guard<std::mutex> l(mu);
    if (broken) return;
    AppendLocked(req);
    if (++unsent_releases >= kMaxUnsentReleases && !FlushLocked().ok()) broken = true;
  }

  // True in a child process made by fork(): its requests would interleave with the parent's on
  // one socket.
  bool Inherited() const { return ::getpid() != owner; }
  static Status InheritedError() {
    return FailedPrecondition("this shardcache connection was opened by another process (fork); "
                              "connect a new Client in this process");
  }

  static Status StatusOf(const v1::LocalResponse& r) {
    if (r.code() == 0) return Status::Ok();
    return Status(static_cast<StatusCode>(r.code()), r.message());
  }

 private:
  void AppendLocked(const v1::LocalRequest& req) {
    const size_t len = req.ByteSizeLong();
    for (int i = 0; i < 4; ++i) unsent.push_back(static_cast<char>((len >> (8 * i)) & 0xff));
    unsent += req.SerializeAsString();
  }

  Status FlushLocked() {
    size_t off = 0;
    while (off < unsent.size()) {
      ssize_t w = ::send(fd, unsent.data() + off, unsent.size() - off, MSG_NOSIGNAL);
      if (w < 0 && errno == EINTR) continue;
      if (w < 0) return Unavailable(std::string("sending to shardcached: ") + std::strerror(errno));
      off += static_cast<size_t>(w);
    }
    unsent.clear();
    unsent_releases = 0;
    return Status::Ok();
  }

  Status ReceiveLocked(v1::LocalResponse* resp, int* received_fd) {
    if (received_fd) *received_fd = -1;
    uint8_t hdr[4];
    SC_RETURN_IF_ERROR(Receive(hdr, 4, received_fd));
    const uint32_t rlen = uint32_t{hdr[0]} | uint32_t{hdr[1]} << 8 | uint32_t{hdr[2]} << 16 |
                          uint32_t{hdr[3]} << 24;
    if (rlen > kMaxMessageBytes) {
      return DataLoss("shardcached sent a " + std::to_string(rlen) + "-byte response (limit " +
                      std::to_string(kMaxMessageBytes) + ")");
    }
    std::string rbody(rlen, '\0');
    if (rlen) SC_RETURN_IF_ERROR(Receive(reinterpret_cast<uint8_t*>(rbody.data()), rlen, received_fd));
    if (!resp->ParseFromString(rbody)) return DataLoss("malformed response from shardcached");
    return Status::Ok();
  }

  // Reads exactly n bytes, collecting a descriptor passed with SCM_RIGHTS. Reads the socket a
  // buffer at a time: a response's length and body arrive together, and each read is a system
  // call.
  Status Receive(uint8_t* p, size_t n, int* received_fd) {
    while (n > 0) {
      if (in_begin == in_end) {
        iovec iov{in.data(), in.size()};
        msghdr msg{};
        msg.msg_iov = &iov;
        msg.msg_iovlen = 1;
        alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 4)];
        msg.msg_control = control;
        msg.msg_controllen = sizeof(control);
        ssize_t r = ::recvmsg(fd, &msg, MSG_CMSG_CLOEXEC);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return Unavailable(std::string("reading from shardcached: ") + std::strerror(errno));
        if (r == 0) return Unavailable("shardcached closed the connection");
        for (cmsghdr* cm = CMSG_FIRSTHDR(&msg); cm; cm = CMSG_NXTHDR(&msg, cm)) {
          if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS) continue;
          const size_t count = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
          for (size_t i = 0; i < count; ++i) {
            int got;
            std::memcpy(&got, CMSG_DATA(cm) + i * sizeof(int), sizeof(int));
            if (received_fd && *received_fd < 0) {
              *received_fd = got;
            } else {
              close(got);  // unexpected: never leak a descriptor
            }
          }
        }
        in_begin = 0;
        in_end = static_cast<size_t>(r);
      }
      const size_t take = std::min(n, in_end - in_begin);
      std::memcpy(p, in.data() + in_begin, take);
      in_begin += take;
      p += take;
      n -= take;
    }
    return Status::Ok();
  }
};

// The daemon-side loader stays open until the Loader and all its Batches are gone.
struct LoaderCore {
  std::shared_ptr<Connection> conn;
  uint64_t id = 0;
  LoaderOptions options;
  std::string version;
  uint64_t samples_per_epoch = 0;
  uint64_t loader_samples = 0;
  uint64_t dataset_samples = 0;
  uint64_t record_bytes = 0;
  std::string format;
  std::string sample_dtype;
  uint32_t block_window_shards = 0;
  // The loader's batch ring (common/batch_ring.h), mapped read-only.
  const uint8_t* ring = nullptr;
  uint64_t ring_bytes = 0;
  uint32_t ring_entries = 0;
  uint32_t ring_max_samples = 0;
  uint64_t ring_stride = 0;
  mutable std::mutex mu;
  uint64_t consumed = 0;    // GUARDED_BY(mu): the rank's resume point after the last batch taken
  std::mutex next_mu;       // one Next() at a time per loader
  uint64_t next_entry = 0;  // GUARDED_BY(next_mu): the next ring entry to read

  ~LoaderCore() {
    v1::LocalRequest req;
    req.mutable_close_loader()->set_loader_id(id);
    v1::LocalResponse resp;
    (void)conn->Call(req, &resp);  // a lost connection closed it already
    if (ring != nullptr) munmap(const_cast<uint8_t*>(ring), ring_bytes);
  }

  // Maps the ring passed with the OpenLoaderResponse and checks its header.
  Status MapRing(int fd, const v1::OpenLoaderResponse& r) {
    if (fd < 0) return DataLoss("shardcached did not pass the batch ring of loader " + std::to_string(id));
    // Every byte the client reads must lie in the file: a shorter one would fault (SIGBUS).
    struct stat st {};
    if (fstat(fd, &st) != 0 || r.ring_bytes() < sizeof(batch_ring::RingHeader) ||
        static_cast<uint64_t>(st.st_size) < r.ring_bytes()) {
      close(fd);
      return DataLoss("shardcached passed a batch ring of " + std::to_string(st.st_size) + " bytes for " +
                      std::to_string(r.ring_bytes()));
    }
    void* p = mmap(nullptr, r.ring_bytes(), PROT_READ, MAP_SHARED, fd, 0);
    const int err = errno;
    close(fd);
    if (p == MAP_FAILED) return Internal(std::string("mapping the batch ring: ") + std::strerror(err));
    ring = static_cast<const uint8_t*>(p);
    ring_bytes = r.ring_bytes();
    const auto& h = *reinterpret_cast<const batch_ring::RingHeader*>(ring);
    ring_entries = h.entries;
    ring_max_samples = h.max_samples;
    ring_stride = h.stride;
    if (h.magic != batch_ring::kMagic ||
        h.layout_version != batch_ring::kLayoutVersion || ring_entries == 0 || ring_entries != r.ring_entries() ||
        ring_max_samples < options.batch_size || ring_stride != batch_ring::Stride(ring_max_samples) ||
        batch_ring::RingBytes(ring_entries, ring_max_samples) > ring_bytes) {
      return DataLoss("shardcached described an inconsistent batch ring");
    }
    return Status::Ok();
  }
};

}  // namespace client_internal

using client_internal::Connection;
using client_internal::LoaderCore;

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
  req.mutable_release_batch()->set_loader_id(core_->id);
  req.mutable_release_batch()->set_slot(slot_);
  req.mutable_release_batch()->set_no_reply(true);
  core_->conn->QueueRelease(req);
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
  // A forked child reading its parent's ring would take the very batches the parent takes.
  if (core_->conn->Inherited()) return Connection::InheritedError();
  std::lock_guard<std::mutex> next_lock(core_->next_mu);
  LoaderCore& c = *core_;
  const uint64_t i = c.next_entry;
  const auto& header = *reinterpret_cast<const batch_ring::RingHeader*>(c.ring);
  uint64_t published = header.published.load(std::memory_order_acquire);
  uint64_t wait_us = 0;
  if (published <= i) {
    // Nothing described yet: ask the daemon to answer once entry i is there.
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
    published = header.published.load(std::memory_order_acquire);  // stored before the answer was sent
    if (published <= i) {
      return DataLoss("shardcached answered a wait for batch ring entry " + std::to_string(i) +
                      " with only " + std::to_string(published) + " published");
    }
  }
  if (published - i > c.ring_entries) {
    return DataLoss("batch ring of loader " + std::to_string(c.id) + " overran: entry " + std::to_string(i) +
                    " was overwritten (" + std::to_string(published) + " published)");
  }
  // Seqlock read: the entry's index before and after the copy must both be i.
  const uint8_t* at = c.ring + batch_ring::EntryOffset(i, c.ring_entries, c.ring_stride);
  const auto& e = *reinterpret_cast<const batch_ring::RingEntry*>(at);
  if (e.index.load(std::memory_order_acquire) != i) {
    return DataLoss("batch ring entry " + std::to_string(i) + " of loader " + std::to_string(c.id) + " is not there");
  }
  const uint32_t slot = e.slot;
  const uint32_t n = e.samples;
  const uint64_t payload_bytes = e.payload_bytes;
  const uint64_t seq = e.batch_seq;
  const uint64_t rank_consumed = e.rank_consumed;
  const uint64_t fields_offset = e.fields_offset;
  const uint64_t fields_bytes = e.fields_bytes;
  if (n > c.ring_max_samples) return DataLoss("shardcached sent an inconsistent batch description");
  const auto* samples = reinterpret_cast<const batch_ring::RingSample*>(at + sizeof(batch_ring::RingEntry));
  Batch b;
  b.ids_.resize(n);
  b.offsets_.resize(n);
  b.lengths_.resize(n);
  for (uint32_t k = 0; k < n; ++k) {
    b.ids_[k] = samples[k].id;
    b.offsets_[k] = samples[k].offset;
    b.lengths_[k] = samples[k].length;
  }
  std::atomic_thread_fence(std::memory_order_acquire);
  if (e.index.load(std::memory_order_relaxed) != i) {
    return DataLoss("batch ring entry " + std::to_string(i) + " of loader " + std::to_string(c.id) +
                    " changed while it was read");
  }
  const Connection& conn = *c.conn;
  if (slot >= conn.slot_count || payload_bytes > conn.slot_bytes) {
    return DataLoss("shardcached sent an inconsistent batch description");
  }
  for (uint32_t k = 0; k < n; ++k) {
    if (b.offsets_[k] > payload_bytes || b.lengths_[k] > payload_bytes - b.offsets_[k]) {
      return DataLoss("shardcached sent a sample range outside its batch");
    }
  }
  const uint8_t* slot_data = conn.arena + uint64_t{slot} * conn.slot_bytes;
  if (fields_bytes > 0) {
    if (fields_offset < payload_bytes || fields_offset > conn.slot_bytes || fields_bytes > conn.slot_bytes - fields_offset) {
      return DataLoss("shardcached placed a field table outside its slot");
    }
    b.fields_ = std::make_unique<sample_fields::FieldsView>();
    if (!b.fields_->Parse(slot_data + fields_offset, fields_bytes, n, b.offsets_.data(), b.lengths_.data())) {
      return DataLoss(std::string("shardcached sent an inconsistent field table: ") + b.fields_->error());
    }
  }
  c.next_entry = i + 1;
  b.core_ = core_;
  b.slot_ = slot;
  b.held_ = true;
  b.data_ = slot_data;
  b.payload_bytes_ = payload_bytes;
  b.record_bytes_ = c.record_bytes;
  b.seq_ = seq;
  b.wait_us_ = wait_us;
  b.consumed_after_ = rank_consumed;
  {
    std::lock_guard<std::mutex> l(c.mu);
    c.consumed = rank_consumed;
  }
  return b;
}

LoaderState Loader::state() const {
  LoaderState s;
  s.epoch = core_->options.epoch;
  s.start_position = core_->options.start_position;
  s.world_size = core_->options.world_size;
  std::lock_guard<std::mutex> l(core_->mu);
  s.samples_consumed = core_->consumed;
  return s;
}

Result<LoaderState> Loader::QueryState() {
  v1::LocalRequest req;
  req.mutable_loader_state()->set_loader_id(core_->id);
  v1::LocalResponse resp;
  SC_RETURN_IF_ERROR(core_->conn->Call(req, &resp));
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
uint32_t Loader::ring_entries() const { return core_->ring_entries; }

// ---- Client

Result<std::unique_ptr<Client>> Client::Connect(const std::string& socket_path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (socket_path.empty() || socket_path.size() >= sizeof(addr.sun_path)) {
    return InvalidArgument("socket path '" + socket_path + "' is empty or too long");
  }
  std::memcpy(addr.sun_path, socket_path.c_str(), socket_path.size() + 1);
  auto conn = std::make_shared<Connection>();
  conn->fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (conn->fd < 0) return Internal(std::string("socket: ") + std::strerror(errno));
  if (::connect(conn->fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    const int err = errno;
    if (err == EACCES || err == EPERM) {
      return PermissionDenied("connecting to " + socket_path + ": " + std::strerror(err));
    }
    return Unavailable("connecting to shardcached at " + socket_path + ": " + std::strerror(err));
  }
  v1::LocalRequest req;
  req.mutable_hello()->set_protocol_version(client_internal::kProtocolVersion);
  v1::LocalResponse resp;
  int arena_fd = -1;
  Status s = conn->Call(req, &resp, &arena_fd);
  if (!s.ok()) {
    if (arena_fd >= 0) close(arena_fd);
    return s.WithContext("hello to shardcached at " + socket_path);
  }
  if (arena_fd < 0) return DataLoss("shardcached did not pass the arena descriptor");
  const auto& h = resp.hello();
  if (h.slot_count() == 0 || h.slot_bytes() == 0 ||
      h.slot_bytes() > h.arena_bytes() / h.slot_count()) {
    close(arena_fd);
    return DataLoss("shardcached described an inconsistent arena");
  }
  // Read-only: the trainer never writes batches; the daemon sealed the size.
  void* p = mmap(nullptr, h.arena_bytes(), PROT_READ, MAP_SHARED, arena_fd, 0);
  const int err = errno;
  close(arena_fd);  // the mapping keeps the memory alive
  if (p == MAP_FAILED) return Internal(std::string("mapping the batch arena: ") + std::strerror(err));
  conn->arena = static_cast<const uint8_t*>(p);
  conn->arena_bytes = h.arena_bytes();
  conn->slot_count = h.slot_count();
  conn->slot_bytes = h.slot_bytes();
  return std::unique_ptr<Client>(new Client(std::move(conn)));
}

Client::~Client() = default;

Result<std::unique_ptr<Loader>> Client::OpenLoader(const LoaderOptions& o) {
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
  Status s = conn_->Call(req, &resp, &ring_fd);
  if (!s.ok()) {
    if (ring_fd >= 0) close(ring_fd);
    return s.WithContext("opening a loader on '" + o.dataset + "'");
  }
  auto core = std::make_shared<LoaderCore>();
  core->conn = conn_;
  core->id = resp.open_loader().loader_id();
  core->options = o;
  core->version = resp.open_loader().version();
  const auto& ol = resp.open_loader();
  core->samples_per_epoch = ol.samples_per_epoch();
  core->loader_samples = ol.loader_samples();
  core->dataset_samples = ol.dataset_samples();
  core->record_bytes = ol.record_bytes();
  core->format = ol.format();
  core->sample_dtype = ol.sample_dtype();
  core->block_window_shards = ol.block_window_shards();
  core->consumed = std::min(o.samples_consumed, core->samples_per_epoch);
  SC_RETURN_IF_ERROR(core->MapRing(ring_fd, resp.open_loader()));  // closes ring_fd; ~LoaderCore closes the loader
  return std::unique_ptr<Loader>(new Loader(std::move(core)));
}

Result<std::string> Client::Stats() {
  v1::LocalRequest req;
  req.mutable_stats();
  v1::LocalResponse resp;
  SC_RETURN_IF_ERROR(conn_->Call(req, &resp));
  return resp.stats().json();
}

uint64_t Client::arena_bytes() const { return conn_->arena_bytes; }
uint32_t Client::slot_count() const { return conn_->slot_count; }
uint64_t Client::slot_bytes() const { return conn_->slot_bytes; }
const uint8_t* Client::arena_data() const { return conn_->arena; }

}  // namespace shardcache
