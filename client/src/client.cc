// libshardcache implementation: framing over the Unix socket, the mapped arena, and the
// shared ownership that keeps a loader open while its batches live.
#include "shardcache/client.h"

#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <vector>

#include "shardcache/local.pb.h"

namespace shardcache {
namespace client_internal {

constexpr uint32_t kProtocolVersion = 1;
constexpr uint32_t kMaxMessageBytes = 16u << 20;
constexpr uint32_t kPollsPerWrite = 3;
constexpr uint32_t kMaxUnsentReleases = 4;
static_assert(kPollsPerWrite <= kBatchesReadAhead);

// One socket and one arena mapping.
//
// The daemon answers requests in order, one response each. Besides plain calls (send, wait
// for the answer) the connection queues two kinds of requests without waiting:
//   - ReleaseBatch: its (empty) answer is read and dropped later;
//   - speculative NextBatch polls (timeout 1 ms), up to kBatchesReadAhead per loader, so that
//     the descriptions of the next batches are usually waiting in the socket when the trainer
//     asks for them, even when the daemon answered one of them late (a node's CPUs are busy; a
//     thread can wait milliseconds to be scheduled).
// Queued requests are written together: when polls are topped up (kPollsPerWrite at a time),
// before anything is read, with any plain call, or once kMaxUnsentReleases releases wait. Every
// write wakes a daemon thread, and on a busy node that thread can take the CPU from the
// trainer, so a trainer pays one wake-up per few batches instead of two per batch.
// `expected` lists, in order, what each outstanding response is for; whoever reads the socket
// files each response where it belongs. Everything is serialized by mu.
struct Connection {
  int fd = -1;
  const uint8_t* arena = nullptr;
  uint64_t arena_bytes = 0;
  uint32_t slot_count = 0;
  uint64_t slot_bytes = 0;

  enum class Expect { kDiscard, kSpeculative };
  struct Outstanding {
    Expect kind;
    uint64_t loader_id;
  };

  std::mutex mu;
  bool broken = false;                           // GUARDED_BY(mu): every call fails fast
  std::deque<Outstanding> expected;              // GUARDED_BY(mu): sent or queued, in order
  std::string unsent;                            // GUARDED_BY(mu): queued frames
  size_t unsent_requests = 0;                    // GUARDED_BY(mu): the last ones in `expected`
  uint32_t unsent_releases = 0;                  // GUARDED_BY(mu)
  std::vector<uint8_t> in = std::vector<uint8_t>(64 << 10);  // GUARDED_BY(mu): read, not yet parsed
  size_t in_begin = 0, in_end = 0;                            // GUARDED_BY(mu)
  // GUARDED_BY(mu): speculative answers by loader, in the order they came.
  std::map<uint64_t, std::deque<v1::LocalResponse>> polled;

  ~Connection() {
    if (arena != nullptr) munmap(const_cast<uint8_t*>(arena), arena_bytes);
    if (fd >= 0) close(fd);
  }

  // Sends req and reads its response; *received_fd gets a descriptor passed with it (or -1).
  Status Call(const v1::LocalRequest& req, v1::LocalResponse* resp, int* received_fd = nullptr) {
    std::lock_guard<std::mutex> l(mu);
    if (broken) return Unavailable("connection to shardcached was lost");
    Status send_error = SendLocked(req);
    // After a failed send, a response may still be waiting: a daemon that refuses a peer answers
    // PermissionDenied before it closes, and that answer says more than EPIPE.
    Status s = DrainLocked();
    if (s.ok()) s = ReceiveLocked(resp, received_fd);
    if (!send_error.ok() || !s.ok()) broken = true;
    if (!s.ok()) return send_error.ok() ? s : send_error;
    return StatusOf(*resp);
  }

  // Queues req without waiting for its response; writes the queue when `write_now`.
  void SendAsync(const v1::LocalRequest& req, Expect kind, uint64_t loader_id, bool write_now) {
    std::lock_guard<std::mutex> l(mu);
    if (broken) return;
    AppendLocked(req);
    expected.push_back({kind, loader_id});
    ++unsent_requests;
    if (kind == Expect::kDiscard && ++unsent_releases >= kMaxUnsentReleases) write_now = true;
    if (write_now && !FlushLocked().ok()) broken = true;
  }

  // The answer to loader_id's oldest unread speculative poll, reading the socket as far as
  // needed.
  Status TakePolled(uint64_t loader_id, v1::LocalResponse* resp) {
    std::lock_guard<std::mutex> l(mu);
    for (;;) {
      if (auto it = polled.find(loader_id); it != polled.end()) {
        *resp = std::move(it->second.front());
        it->second.pop_front();
        if (it->second.empty()) polled.erase(it);
        return Status::Ok();
      }
      if (broken) return Unavailable("connection to shardcached was lost");
      if (expected.empty()) return Internal("no speculative request outstanding");
      // Queued releases stay queued unless the answer needed is behind them.
      Status s = expected.size() <= unsent_requests ? FlushLocked() : Status::Ok();
      if (s.ok()) s = DrainOneLocked();
      if (!s.ok()) {
        broken = true;
        return s;
      }
    }
  }

  // Forgets a loader's unread speculative answers (its loader is closing).
  void DropPolled(uint64_t loader_id) {
    std::lock_guard<std::mutex> l(mu);
    polled.erase(loader_id);
  }

  static Status StatusOf(const v1::LocalResponse& r) {
    if (r.code() == 0) return Status::Ok();
    return Status(static_cast<StatusCode>(r.code()), r.message());
  }

 private:
  // Writes req after whatever is queued.
  Status SendLocked(const v1::LocalRequest& req) {
    AppendLocked(req);
    return FlushLocked();
  }

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
    unsent_requests = 0;
    unsent_releases = 0;
    return Status::Ok();
  }

  // Reads the responses of every request sent without waiting.
  Status DrainLocked() {
    while (!expected.empty()) SC_RETURN_IF_ERROR(DrainOneLocked());
    return Status::Ok();
  }

  Status DrainOneLocked() {
    const Outstanding o = expected.front();
    expected.pop_front();
    v1::LocalResponse r;
    SC_RETURN_IF_ERROR(ReceiveLocked(&r, nullptr));
    if (o.kind == Expect::kSpeculative) polled[o.loader_id].push_back(std::move(r));
    return Status::Ok();  // a release's answer: an error only means the slot was already free
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
  // buffer at a time: the answers to queued requests usually arrive together, and each read is
  // a system call.
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
  uint64_t dataset_samples = 0;
  uint64_t record_bytes = 0;
  mutable std::mutex mu;
  uint64_t consumed = 0;       // GUARDED_BY(mu)
  std::mutex next_mu;          // one Next() at a time per loader
  uint32_t polls_pending = 0;  // GUARDED_BY(next_mu): speculative NextBatch polls not yet taken

  ~LoaderCore() {
    v1::LocalRequest req;
    req.mutable_close_loader()->set_loader_id(id);
    v1::LocalResponse resp;
    (void)conn->Call(req, &resp);  // a lost connection closed it already
    // Batches read ahead but never handed out: the daemon freed their slots with the loader.
    conn->DropPolled(id);
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
    ids_ = std::move(o.ids_);
    offsets_ = std::move(o.offsets_);
    lengths_ = std::move(o.lengths_);
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
  core_->conn->SendAsync(req, Connection::Expect::kDiscard, core_->id, /*write_now=*/false);
  core_.reset();
  data_ = nullptr;
  ids_.clear();
  offsets_.clear();
  lengths_.clear();
  payload_bytes_ = 0;
  return Status::Ok();
}

// ---- Loader

Loader::~Loader() = default;

Result<Batch> Loader::Next() {
  std::lock_guard<std::mutex> next_lock(core_->next_mu);
  v1::LocalResponse resp;
  bool have = false;
  // The polls' answers come in plan order: one that found its batch not ready (or no slot free
  // at that moment) took nothing, so the next answer holds the next batch.
  while (!have && core_->polls_pending > 0) {
    --core_->polls_pending;
    SC_RETURN_IF_ERROR(core_->conn->TakePolled(core_->id, &resp));
    have = resp.code() == 0;
  }
  if (!have) {
    // None ready: ask again, this time waiting.
    v1::LocalRequest req;
    req.mutable_next_batch()->set_loader_id(core_->id);
    req.mutable_next_batch()->set_timeout_ms(core_->options.next_timeout_ms);
    SC_RETURN_IF_ERROR(core_->conn->Call(req, &resp));
  }
  const auto& r = resp.next_batch();
  if (r.end_of_epoch()) return OutOfRange("end of epoch");
  // Ask for the following batches ahead, a few at once; the answers wait in the socket until
  // Next() takes them.
  if (core_->polls_pending + client_internal::kPollsPerWrite <= kBatchesReadAhead) {
    for (; core_->polls_pending < kBatchesReadAhead; ++core_->polls_pending) {
      v1::LocalRequest poll;
      poll.mutable_next_batch()->set_loader_id(core_->id);
      poll.mutable_next_batch()->set_timeout_ms(1);
      core_->conn->SendAsync(poll, Connection::Expect::kSpeculative, core_->id,
                             /*write_now=*/core_->polls_pending + 1 == kBatchesReadAhead);
    }
  }
  const Connection& c = *core_->conn;
  const size_t n = static_cast<size_t>(r.sample_ids_size());
  if (r.slot() >= c.slot_count || r.offset() > c.arena_bytes || r.payload_bytes() > c.slot_bytes ||
      r.offset() + r.payload_bytes() > c.arena_bytes || static_cast<size_t>(r.sample_offsets_size()) != n ||
      static_cast<size_t>(r.sample_lengths_size()) != n) {
    return DataLoss("shardcached sent an inconsistent batch description");
  }
  Batch b;
  b.core_ = core_;
  b.slot_ = r.slot();
  b.held_ = true;
  b.data_ = c.arena + r.offset();
  b.payload_bytes_ = r.payload_bytes();
  b.record_bytes_ = r.record_bytes();
  b.seq_ = r.batch_seq();
  b.wait_us_ = r.wait_us();
  b.ids_.assign(r.sample_ids().begin(), r.sample_ids().end());
  b.offsets_.assign(r.sample_offsets().begin(), r.sample_offsets().end());
  b.lengths_.assign(r.sample_lengths().begin(), r.sample_lengths().end());
  for (size_t i = 0; i < n; ++i) {
    if (b.offsets_[i] > b.payload_bytes_ || b.lengths_[i] > b.payload_bytes_ - b.offsets_[i]) {
      return DataLoss("shardcached sent a sample range outside its batch");
    }
  }
  {
    std::lock_guard<std::mutex> l(core_->mu);
    core_->consumed += n;
  }
  return b;
}

LoaderState Loader::state() const {
  std::lock_guard<std::mutex> l(core_->mu);
  return {core_->options.epoch, core_->consumed};
}

Result<LoaderState> Loader::QueryState() {
  v1::LocalRequest req;
  req.mutable_loader_state()->set_loader_id(core_->id);
  v1::LocalResponse resp;
  SC_RETURN_IF_ERROR(core_->conn->Call(req, &resp));
  return LoaderState{resp.loader_state().epoch(), resp.loader_state().samples_consumed()};
}

uint64_t Loader::samples_per_epoch() const { return core_->samples_per_epoch; }
uint64_t Loader::dataset_samples() const { return core_->dataset_samples; }
uint64_t Loader::record_bytes() const { return core_->record_bytes; }
const std::string& Loader::version() const { return core_->version; }
const LoaderOptions& Loader::options() const { return core_->options; }

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
  v1::LocalResponse resp;
  SC_RETURN_IF_ERROR(conn_->Call(req, &resp).WithContext("opening a loader on '" + o.dataset + "'"));
  auto core = std::make_shared<LoaderCore>();
  core->conn = conn_;
  core->id = resp.open_loader().loader_id();
  core->options = o;
  core->version = resp.open_loader().version();
  core->samples_per_epoch = resp.open_loader().samples_per_epoch();
  core->dataset_samples = resp.open_loader().dataset_samples();
  core->record_bytes = resp.open_loader().record_bytes();
  core->consumed = std::min(o.samples_consumed, core->samples_per_epoch);
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
