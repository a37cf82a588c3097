// The local service end to end: a real Unix socket, real memfd arenas, a FileSource over
// datasets written by tests/testing, and the real client library (in process and in child
// processes).
#include <catch2/catch.hpp>

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <map>
#include <set>
#include <thread>

#include "shardcache/batch_ring.h"
#include "common/fs.h"
#include "common/metrics.h"
#include "daemon/serve/local_service.h"
#include "daemon/serve/serve_metrics.h"
#include "daemon/upstream/file_source.h"
#include "shardcache/c_api.h"
#include "shardcache/client.h"
#include "testing/datasets.h"
#include "testing/process.h"
#include "testing/eventually.h"
#include "testing/temp_dir.h"
#include "testing/forwarding_source.h"
#include "testing/local_conn.h"
#include "testing/other_user.h"
#include "testing/random_delay.h"
#include "local_fixture.h"

using namespace shardcache;
using shardcache::testing::Eventually;
using shardcache::testing::TempDir;
using shardcache::testing::ExpectedSamples;
using shardcache::testing::Fixture;
using shardcache::testing::ReadEpoch;

namespace {

// A source that answers after a random delay, to show that timing never changes a plan.
class JitterSource final : public testing::ForwardingSource {
 public:
  JitterSource(ChunkSource& inner, uint32_t seed) : ForwardingSource(inner), delay_(seed, 3000) {}
  Status ReadChunks(const DatasetPtr& d, uint32_t shard, uint64_t first, uint64_t count,
                    const ReadOptions& o, const ChunkSink& sink) override {
    delay_.Sleep();
    reads_++;
    return inner_.ReadChunks(d, shard, first, count, o, sink);
  }
  std::atomic<uint64_t> reads_{0};

 private:
  testing::RandomDelay delay_;
};

int CountFds() {
  int n = 0;
  DIR* d = opendir("/proc/self/fd");
  while (dirent* e = readdir(d)) n += e->d_name[0] != '.';
  closedir(d);
  return n;
}

std::set<std::string> DevShm() {
  std::set<std::string> names;
  if (DIR* d = opendir("/dev/shm")) {
    while (dirent* e = readdir(d)) names.insert(e->d_name);
    closedir(d);
  }
  return names;
}

}  // namespace

TEST_CASE("the daemon listens by default where the client connects by default", "[serve]") {
  CHECK(serve::LocalServiceOptions{}.socket_path == std::string(shardcache::kDefaultSocketPath));
}

TEST_CASE("batches are byte-exact and every sample comes once per epoch across ranks, but for "
          "the padding that gives every rank the same batch count",
          "[serve][integration]") {
  Fixture f;
  serve::LocalService svc(*f.files, f.Options());
  REQUIRE(svc.Start().ok());
  for (auto* ds : {&f.records, &f.tars}) {
    const std::string name = (*ds)->name;
    ExpectedSamples expected(f.root + "/" + name, **ds);
    const uint64_t n = expected.size();
    for (auto mode : {Shuffle::kNone, Shuffle::kGlobal, Shuffle::kBlock}) {
      for (uint32_t world : {1u, 3u, 7u}) {
        for (bool pad : {true, false}) {
          CAPTURE(name, static_cast<int>(mode), world, pad);
          std::vector<int> seen(n, 0);
          std::set<size_t> batch_counts;
          uint64_t total = 0;
          // One client per rank, as trainers would.
          for (uint32_t rank = 0; rank < world; ++rank) {
            auto c = Client::Connect(f.socket);
            REQUIRE(c.ok());
            LoaderOptions o;
            o.dataset = name;
            o.batch_size = 16;
            o.seed = 7;
            o.epoch = 1;
            o.shuffle = mode;
            o.rank = rank;
            o.world_size = world;
            o.pad = pad;
            auto e = ReadEpoch(**c, o, expected);
            for (uint64_t id : e.all) seen[id]++;
            total += e.all.size();
            batch_counts.insert(e.batches.size());
            for (size_t b = 0; b + 1 < e.batches.size(); ++b) REQUIRE(e.batches[b].size() == 16);
          }
          if (pad) {
            // DistributedSampler's contract: equal counts (a DDP job's ranks end together), only
            // the padding repeated.
            REQUIRE(batch_counts.size() == 1);
            REQUIRE(total == (n + world - 1) / world * world);
            REQUIRE(std::all_of(seen.begin(), seen.end(), [](int c) { return c == 1 || c == 2; }));
          } else {
            REQUIRE(total == n);
            REQUIRE(std::all_of(seen.begin(), seen.end(), [](int c) { return c == 1; }));
          }
        }
      }
    }
  }
  // `shardctl top`'s series are per (dataset, rank), not per loader id (which grows with every
  // open): they outlive the loader, and only the open count goes back. Assembly latency is
  // recorded.
  const metrics::Labels pair = {{"dataset", f.records->name}, {"rank", "2"}};
  {
    auto c = Client::Connect(f.socket);
    REQUIRE(c.ok());
    LoaderOptions o;
    o.dataset = f.records->name;
    o.batch_size = 4;
    o.rank = 2;
    o.world_size = 4;
    auto loader = (*c)->OpenLoader(o);
    REQUIRE(loader.ok());
    REQUIRE((*loader)->Next().ok());
    const std::string text = metrics::Registry::Global().RenderPrometheus();
    CHECK(text.find("loader=") == std::string::npos);
    CHECK(metrics::Registry::Global().ValueOf("shardcache_loader_batches_total", pair) >= 1);
    CHECK(metrics::Registry::Global().ValueOf("shardcache_loader_open", pair) == 1);
    CHECK(metrics::Registry::Global().ValueOf("shardcache_loader_stall_seconds_total", pair) >= 0);
  }
  CHECK(Eventually([&] { return metrics::Registry::Global().ValueOf("shardcache_loader_open", pair) == 0; }));
  CHECK(metrics::Registry::Global().ValueOf("shardcache_loader_batches_total", pair) >= 1);
  const std::string text = metrics::Registry::Global().RenderPrometheus();
  CHECK(metrics::Registry::Global().ValueOf("shardcache_serve_batches_total") > 0);
  CHECK(text.find("shardcache_serve_batch_assembly_seconds_count") != std::string::npos);
}

TEST_CASE("the same plan is served whether the cache is cold or warm and whatever the timing",
          "[serve][integration]") {
  Fixture f;
  ExpectedSamples expected(f.root + "/rec", *f.records);
  LoaderOptions o;
  o.dataset = "rec";
  o.batch_size = 10;
  o.seed = 3;
  o.shuffle = Shuffle::kGlobal;
  o.world_size = 2;
  o.rank = 1;
  o.drop_last = true;
  std::vector<std::vector<std::vector<uint64_t>>> runs;
  // Direct and jittery sources, with no prefetch and deep prefetch: the same batches each time.
  for (int variant = 0; variant < 3; ++variant) {
    JitterSource jitter(*f.files, 100 + variant);
    auto opts = f.Options();
    opts.prefetch_batches = variant == 0 ? 1 : 6;
    opts.prefetch_lookahead_bytes = variant == 2 ? 0 : 1 << 20;
    serve::LocalService svc(variant == 0 ? static_cast<ChunkSource&>(*f.files) : jitter, opts);
    REQUIRE(svc.Start().ok());
    auto c = Client::Connect(f.socket);
    REQUIRE(c.ok());
    // Twice per service: the second epoch finds everything read before.
    for (int pass = 0; pass < 2; ++pass) runs.push_back(ReadEpoch(**c, o, expected).batches);
  }
  REQUIRE(runs[0].size() == 1000 / 2 / 10);
  for (const auto& r : runs) REQUIRE(r == runs[0]);
}

TEST_CASE("resuming mid-epoch from the loader state yields exactly the remaining order",
          "[serve][integration]") {
  Fixture f;
  ExpectedSamples expected(f.root + "/tars", *f.tars);
  serve::LocalService svc(*f.files, f.Options());
  REQUIRE(svc.Start().ok());
  for (auto mode : {Shuffle::kGlobal, Shuffle::kBlock}) {
    LoaderOptions o;
    o.dataset = "tars";
    o.batch_size = 7;
    o.seed = 11;
    o.epoch = 5;
    o.shuffle = mode;
    o.world_size = 2;
    auto c = Client::Connect(f.socket);
    REQUIRE(c.ok());
    const auto full = ReadEpoch(**c, o, expected).all;

    LoaderState state;
    std::vector<uint64_t> first_part;
    {
      // A trainer that stops after 5 batches (with prefetched batches in flight) ...
      auto c1 = Client::Connect(f.socket);
      REQUIRE(c1.ok());
      auto loader = (*c1)->OpenLoader(o);
      REQUIRE(loader.ok());
      for (int i = 0; i < 5; ++i) {
        auto b = (*loader)->Next();
        REQUIRE(b.ok());
        first_part.insert(first_part.end(), b->sample_ids().begin(), b->sample_ids().end());
      }
      state = (*loader)->state();
      auto daemon_state = (*loader)->QueryState();
      REQUIRE(daemon_state.ok());
      // The daemon also counts the batches it described ahead in the loader's batch ring.
      REQUIRE(daemon_state->samples_consumed >= state.samples_consumed);
      REQUIRE(daemon_state->samples_consumed <= state.samples_consumed + (*loader)->ring_entries() * o.batch_size);
      REQUIRE(state.samples_consumed == 35);
    }
    // ... and a new process resuming from its state.
    auto c2 = Client::Connect(f.socket);
    REQUIRE(c2.ok());
    auto o2 = o;
    o2.samples_consumed = state.samples_consumed;
    auto rest = ReadEpoch(**c2, o2, expected).all;
    first_part.insert(first_part.end(), rest.begin(), rest.end());
    REQUIRE(first_part == full);
  }
}

TEST_CASE("a client holding every slot gets ResourceExhausted instead of a hang",
          "[serve][integration]") {
  Fixture f;
  auto opts = f.Options();
  opts.slot_count = 4;
  serve::LocalService svc(*f.files, opts);
  REQUIRE(svc.Start().ok());
  auto c = Client::Connect(f.socket);
  REQUIRE(c.ok());
  LoaderOptions o;
  o.dataset = "rec";
  o.batch_size = 8;
  auto first = (*c)->OpenLoader(o);
  REQUIRE(first.ok());
  // A loader's batch ring describes at most half the slots: holding that many is the limit.
  REQUIRE((*first)->ring_entries() == 2);
  std::vector<Batch> held;
  for (int i = 0; i < 2; ++i) {
    auto b = (*first)->Next();
    REQUIRE(b.ok());
    held.push_back(std::move(*b));
  }
  auto b = (*first)->Next();
  REQUIRE(b.status().code() == StatusCode::kResourceExhausted);
  REQUIRE(b.status().message().find("release") != std::string::npos);
  // Releasing one makes the next call succeed, in order.
  const uint64_t last = held.back().sample_id(7);
  held.erase(held.begin());
  auto b2 = (*first)->Next();
  REQUIRE(b2.ok());
  REQUIRE(b2->sample_id(0) == last + 1);
  held.push_back(std::move(*b2));

  // A second loader takes the other two slots; then every slot is held and neither loader can
  // get a batch until one is released.
  o.seed = 3;
  o.shuffle = Shuffle::kGlobal;
  auto second = (*c)->OpenLoader(o);
  REQUIRE(second.ok());
  for (int i = 0; i < 2; ++i) {
    auto s = (*second)->Next();
    REQUIRE(s.ok());
    held.push_back(std::move(*s));
  }
  for (auto* l : {&*first, &*second}) {
    auto s = (**l).Next();
    REQUIRE(s.status().code() == StatusCode::kResourceExhausted);
  }
  held.clear();
  REQUIRE((*second)->Next().ok());
}

TEST_CASE("a loader opened right after releases gets its batch ring", "[serve][integration]") {
  Fixture f;
  serve::LocalService svc(*f.files, f.Options());
  REQUIRE(svc.Start().ok());
  auto c = Client::Connect(f.socket);
  REQUIRE(c.ok());
  LoaderOptions o;
  o.dataset = "rec";
  o.batch_size = 5;
  // Each round queues releases without sending them; OpenLoader sends them first, and its
  // answer (with the ring's descriptor) must be the first frame that comes back.
  for (int round = 0; round < 40; ++round) {
    auto loader = (*c)->OpenLoader(o);
    REQUIRE(loader.ok());
    for (int i = 0; i < 3; ++i) REQUIRE((*loader)->Next().ok());  // each Batch released at once
    auto next = (*c)->OpenLoader(o);
    REQUIRE(next.ok());
    REQUIRE((*next)->Next().ok());
  }
  CHECK(CountFds() < 100);
}

TEST_CASE("a batch ring describes up to 64 batches, at most half the slots, fewer for huge batches",
          "[serve]") {
  CHECK(serve::RingEntriesFor(8, 16) == 8);
  CHECK(serve::RingEntriesFor(128, 16) == serve::kRingEntries);
  CHECK(serve::RingEntriesFor(0, 16) == 1);
  // 2^20 samples: 24 MiB of descriptions per entry, so two entries fit in the 64 MiB limit.
  const uint32_t huge = serve::RingEntriesFor(64, 1u << 20);
  CHECK(huge == 2);
  CHECK(batch_ring::RingBytes(huge, 1u << 20) <= batch_ring::kMaxRingBytes);
}

TEST_CASE("opening a loader faults in the part of every arena slot its batches fill", "[serve][integration]") {
  Fixture f;
  auto options = f.Options();
  options.arena_bytes = 256ull << 20;  // 256 slots of 1 MiB: the connection faults in 256 KiB of each
  options.slot_count = 256;
  serve::LocalService svc(*f.files, options);
  REQUIRE(svc.Start().ok());
  testing::LocalConn conn(f.socket);
  int arena_fd = -1;
  const auto hello = conn.Hello(local_wire::kProtocolVersion, &arena_fd);
  UniqueFd owned(arena_fd);
  const uint64_t slot_bytes = hello.slot_bytes();
  void* map = mmap(nullptr, hello.arena_bytes(), PROT_READ, MAP_SHARED, arena_fd, 0);
  REQUIRE(map != MAP_FAILED);
  // Slot 200 is beyond every slot the loader below may fill (it holds at most 128).
  auto resident = [&](uint64_t offset_in_slot) {
    unsigned char v = 0;
    REQUIRE(mincore(static_cast<uint8_t*>(map) + 200 * slot_bytes + offset_in_slot, 4096, &v) == 0);
    return (v & 1) != 0;
  };
  if (!resident(0)) {
    WARN("this kernel has no MADV_POPULATE_WRITE; pages are faulted on first use");
  } else {
    CHECK(!resident(512 << 10));
    conn.OpenLoader("rec", 900, /*ring=*/true);  // batches of 900 records of 1000 bytes
    CHECK(resident(512 << 10));
    CHECK(resident(899999 / 4096 * 4096));        // the page with the batch's last byte
    CHECK(!resident((899999 / 4096 + 1) * 4096));  // and not one page more
  }
  munmap(map, hello.arena_bytes());
}

TEST_CASE("releases sent with no_reply are not answered, however many come before the next call",
          "[serve][integration]") {
  // A ring loader's client releases a batch for every one it reads and may make no other call
  // for a whole epoch. Were those releases answered, the unread answers would fill the socket
  // and block the daemon's connection thread, and with it every later release.
  Fixture f;
  serve::LocalService svc(*f.files, f.Options());
  REQUIRE(svc.Start().ok());
  testing::LocalConn conn(f.socket);
  conn.Hello(local_wire::kProtocolVersion);
  const uint64_t loader = conn.OpenLoader("rec", 10, /*ring=*/true).loader_id();
  v1::LocalRequest release;
  release.mutable_release_batch()->set_loader_id(loader);
  release.mutable_release_batch()->set_slot(1000000);  // never held: refused, and only logged
  release.mutable_release_batch()->set_no_reply(true);
  for (int i = 0; i < 5000; ++i) conn.Send(release);
  v1::LocalRequest state;
  state.mutable_loader_state()->set_loader_id(loader);
  auto answer = conn.Call(state);  // the first frame back is this call's answer
  CHECK(answer.code() == 0);
  CHECK(answer.has_loader_state());
  // Without no_reply (older clients) a release is answered, and a refused one says why.
  release.mutable_release_batch()->set_no_reply(false);
  auto refused = conn.Call(release);
  CHECK(refused.code() == static_cast<uint32_t>(StatusCode::kFailedPrecondition));
  CHECK_THAT(refused.message(), Catch::Contains("slot 1000000"));
}

TEST_CASE("a protocol-2 client still reads an epoch through NextBatch, byte-exact and in plan order",
          "[serve][integration]") {
  Fixture f;
  serve::LocalService svc(*f.files, f.Options());
  REQUIRE(svc.Start().ok());
  ExpectedSamples expected(f.root + "/rec", *f.records);
  LoaderOptions o;
  o.dataset = "rec";
  o.batch_size = 24;
  o.seed = 4;
  o.shuffle = Shuffle::kGlobal;
  auto c = Client::Connect(f.socket);
  REQUIRE(c.ok());
  const auto through_ring = ReadEpoch(**c, o, expected).all;

  testing::LocalConn old(f.socket);
  int arena_fd = -1;
  const auto hello = old.Hello(2, &arena_fd);
  const uint64_t arena_bytes = hello.arena_bytes();
  void* arena = mmap(nullptr, arena_bytes, PROT_READ, MAP_SHARED, arena_fd, 0);
  ::close(arena_fd);
  REQUIRE(arena != MAP_FAILED);
  v1::LocalRequest req;
  auto* open = req.mutable_open_loader();
  open->set_dataset("rec");
  open->set_batch_size(24);
  open->set_seed(4);
  open->set_shuffle(v1::SHUFFLE_GLOBAL);
  open->set_world_size(1);
  int ring_fd = -1;
  auto opened = old.Call(req, &ring_fd);
  REQUIRE(opened.code() == 0);
  CHECK(ring_fd < 0);  // no batch ring unless asked for
  CHECK(opened.open_loader().ring_entries() == 0);
  std::vector<uint64_t> through_socket;
  for (;;) {
    req.Clear();
    req.mutable_next_batch()->set_loader_id(opened.open_loader().loader_id());
    auto r = old.Call(req);
    REQUIRE(r.code() == 0);
    const auto& nb = r.next_batch();
    if (nb.end_of_epoch()) break;
    const auto* payload = static_cast<const char*>(arena) + nb.offset();
    for (int i = 0; i < nb.sample_ids_size(); ++i) {
      REQUIRE(std::string(payload + nb.sample_offsets(i), nb.sample_lengths(i)) == expected[nb.sample_ids(i)]);
      through_socket.push_back(nb.sample_ids(i));
    }
    req.Clear();
    req.mutable_release_batch()->set_loader_id(opened.open_loader().loader_id());
    req.mutable_release_batch()->set_slot(nb.slot());
    REQUIRE(old.Call(req).code() == 0);
  }
  munmap(arena, arena_bytes);
  CHECK(through_socket == through_ring);
  CHECK(through_socket.size() == 1000);
}

TEST_CASE("batch ring waits a confused or hostile client sends are refused, and the ring is read-only",
          "[serve][integration]") {
  Fixture f;
  serve::LocalService svc(*f.files, f.Options());
  REQUIRE(svc.Start().ok());
  ExpectedSamples expected(f.root + "/rec", *f.records);
  testing::LocalConn conn(f.socket);
  conn.Hello(local_wire::kProtocolVersion);
  auto wait = [&](uint64_t loader, bool ring, uint64_t index) {
    v1::LocalRequest w;
    w.mutable_next_batch()->set_loader_id(loader);
    w.mutable_next_batch()->set_ring(ring);
    w.mutable_next_batch()->set_ring_index(index);
    w.mutable_next_batch()->set_timeout_ms(5000);
    return conn.Call(w);
  };
  int ring_fd = -1;
  const auto with_ring = conn.OpenLoader("rec", 10, /*ring=*/true, &ring_fd);
  REQUIRE(ring_fd >= 0);
  REQUIRE(with_ring.ring_entries() == f.Options().slot_count / 2);
  REQUIRE(with_ring.ring_bytes() == batch_ring::RingBytes(with_ring.ring_entries(), 10));
  int no_fd = -1;
  const auto without_ring = conn.OpenLoader("rec", 10, /*ring=*/false, &no_fd);
  REQUIRE(no_fd < 0);

  // Asking the socket for a batch of a ring loader, or waiting on the ring of a loader without
  // one, is a protocol error; so is an entry beyond the next unpublished one.
  auto r = wait(with_ring.loader_id(), false, 0);
  CHECK(r.code() == static_cast<uint32_t>(StatusCode::kFailedPrecondition));
  CHECK(r.message().find("batch ring") != std::string::npos);
  r = wait(without_ring.loader_id(), true, 0);
  CHECK(r.code() == static_cast<uint32_t>(StatusCode::kFailedPrecondition));
  r = wait(with_ring.loader_id(), true, 1000);
  CHECK(r.code() == static_cast<uint32_t>(StatusCode::kInvalidArgument));
  CHECK(r.message().find("entry 1000") != std::string::npos);

  // A proper wait: entry 0 is there, and describes the plan's first batch, byte-exact.
  r = wait(with_ring.loader_id(), true, 0);
  REQUIRE(r.code() == 0);
  REQUIRE(r.next_batch().ring_published() >= 1);
  // The client can map the ring only read-only (F_SEAL_FUTURE_WRITE).
  CHECK(mmap(nullptr, with_ring.ring_bytes(), PROT_READ | PROT_WRITE, MAP_SHARED, ring_fd, 0) == MAP_FAILED);
  void* ring = mmap(nullptr, with_ring.ring_bytes(), PROT_READ, MAP_SHARED, ring_fd, 0);
  ::close(ring_fd);
  REQUIRE(ring != MAP_FAILED);
  const auto* base = static_cast<const uint8_t*>(ring);
  const auto& h = *reinterpret_cast<const batch_ring::RingHeader*>(base);
  CHECK(h.magic == batch_ring::kMagic);
  CHECK(h.published.load() >= 1);
  const auto& e = *reinterpret_cast<const batch_ring::RingEntry*>(base + batch_ring::EntryOffset(0, h.entries, h.stride));
  CHECK(e.index.load() == 0);
  REQUIRE(e.samples == 10);
  const auto* samples = reinterpret_cast<const batch_ring::RingSample*>(base + batch_ring::EntryOffset(0, h.entries, h.stride) + sizeof(batch_ring::RingEntry));
  for (uint32_t k = 0; k < e.samples; ++k) {
    CHECK(samples[k].id == k);  // shuffle none: file order
    CHECK(samples[k].length == expected[k].size());
  }
  munmap(ring, with_ring.ring_bytes());
  // Waits go on working after the refusals: the connection stays usable.
  CHECK(wait(with_ring.loader_id(), true, 1).code() == 0);
}

TEST_CASE("a batch too large for a slot is refused with a clear error", "[serve][integration]") {
  Fixture f;
  serve::LocalService svc(*f.files, f.Options());  // 512 KiB slots
  REQUIRE(svc.Start().ok());
  auto c = Client::Connect(f.socket);
  REQUIRE(c.ok());
  LoaderOptions o;
  o.dataset = "rec";
  o.batch_size = 1000;  // 1 MB of records
  auto loader = (*c)->OpenLoader(o);
  REQUIRE(loader.status().code() == StatusCode::kResourceExhausted);
  REQUIRE(loader.status().message().find("slot") != std::string::npos);
  o.dataset = "missing";
  o.batch_size = 4;
  REQUIRE((*c)->OpenLoader(o).status().code() == StatusCode::kNotFound);
  o.dataset = "rec";
  o.rank = 2;
  o.world_size = 2;
  REQUIRE((*c)->OpenLoader(o).status().code() == StatusCode::kInvalidArgument);
}

TEST_CASE("loaders, batches and clients may be destroyed in any order", "[serve][integration]") {
  Fixture f;
  ExpectedSamples expected(f.root + "/rec", *f.records);
  serve::LocalService svc(*f.files, f.Options());
  REQUIRE(svc.Start().ok());
  std::optional<Batch> kept;
  {
    auto c = Client::Connect(f.socket);
    REQUIRE(c.ok());
    LoaderOptions o;
    o.dataset = "rec";
    o.batch_size = 5;
    auto loader = (*c)->OpenLoader(o);
    REQUIRE(loader.ok());
    auto b = (*loader)->Next();
    REQUIRE(b.ok());
    kept.emplace(std::move(*b));
  }  // loader and client gone; the batch keeps the connection and the daemon's loader open
  REQUIRE(svc.loader_count() == 1);
  for (size_t i = 0; i < kept->size(); ++i) {
    const auto v = kept->sample(i);
    REQUIRE(std::string(reinterpret_cast<const char*>(v.data), v.size) == expected[kept->sample_id(i)]);
  }
  kept.reset();
  REQUIRE(Eventually([&] { return svc.connection_count() == 0 && svc.loader_count() == 0; }));
}

TEST_CASE("a client killed with SIGKILL mid-batch leaves no slot, fd or /dev/shm entry while "
          "another client keeps being served",
          "[serve][integration]") {
  Fixture f;
  ExpectedSamples expected(f.root + "/rec", *f.records);
  serve::LocalService svc(*f.files, f.Options());
  REQUIRE(svc.Start().ok());

  // The bystander: a trainer in this process reading epochs the whole time.
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> bystander_batches{0};
  std::atomic<bool> bystander_ok{true};
  std::thread bystander([&] {
    auto c = Client::Connect(f.socket);
    if (!c.ok()) { bystander_ok = false; return; }
    LoaderOptions o;
    o.dataset = "rec";
    o.batch_size = 8;
    o.shuffle = Shuffle::kGlobal;
    for (uint64_t epoch = 0; !stop; ++epoch) {
      o.epoch = epoch;
      auto loader = (*c)->OpenLoader(o);
      if (!loader.ok()) { bystander_ok = false; return; }
      while (!stop) {
        auto b = (*loader)->Next();
        if (!b.ok()) {
          if (b.status().code() != StatusCode::kOutOfRange) bystander_ok = false;
          break;
        }
        for (size_t i = 0; i < b->size(); ++i) {
          const auto v = b->sample(i);
          if (std::string(reinterpret_cast<const char*>(v.data), v.size) != expected[b->sample_id(i)]) {
            bystander_ok = false;
          }
        }
        bystander_batches++;
      }
    }
  });
  REQUIRE(Eventually([&] { return bystander_batches > 0; }));
  const int fds_before = CountFds();
  const auto shm_before = DevShm();
  const size_t conns_before = svc.connection_count();
  const uint32_t slots_before_max = svc.slots_in_use();
  (void)slots_before_max;

  const int iterations = 10;
  for (int i = 0; i < iterations; ++i) {
    const std::string marker = f.tmp.path() + "/ready-" + std::to_string(i);
    testing::Process child({testing::BinPath("local_client_helper"), f.socket, "rec", "8", "3", marker},
                           f.tmp.path() + "/helper.log");
    REQUIRE(testing::WaitForFile(marker));
    REQUIRE(svc.connection_count() == conns_before + 1);
    const uint64_t before = bystander_batches;
    child.Kill();
    // The dead client's connection, loader and slots go away ...
    REQUIRE(Eventually([&] { return svc.connection_count() == conns_before; }));
    // ... while the bystander keeps getting batches.
    REQUIRE(Eventually([&] { return bystander_batches > before; }));
  }
  stop = true;
  bystander.join();
  REQUIRE(bystander_ok);
  REQUIRE(Eventually([&] { return svc.connection_count() == 0; }));
  REQUIRE(svc.slots_in_use() == 0);
  REQUIRE(svc.loader_count() == 0);
  // The bystander's own connection is gone too, so one fewer socket than before.
  REQUIRE(Eventually([&] { return CountFds() <= fds_before - 1; }));
  REQUIRE(DevShm() == shm_before);
}

TEST_CASE("100 clients killed with SIGKILL in a row leave nothing behind", "[serve][slow]") {
  Fixture f;
  serve::LocalService svc(*f.files, f.Options());
  REQUIRE(svc.Start().ok());
  const int fds_before = CountFds();
  const auto shm_before = DevShm();
  for (int i = 0; i < 100; ++i) {
    const std::string marker = f.tmp.path() + "/ready-" + std::to_string(i);
    testing::Process child({testing::BinPath("local_client_helper"), f.socket, "rec", "8", "4", marker},
                           f.tmp.path() + "/helper.log");
    REQUIRE(testing::WaitForFile(marker));
    child.Kill();
    REQUIRE(Eventually([&] { return svc.connection_count() == 0; }));
  }
  REQUIRE(svc.slots_in_use() == 0);
  REQUIRE(Eventually([&] { return CountFds() == fds_before; }));
  REQUIRE(DevShm() == shm_before);
  // Still serving.
  auto c = Client::Connect(f.socket);
  REQUIRE(c.ok());
}

TEST_CASE("a uid that is not allowed is refused before any descriptor is passed",
          "[serve][integration]") {
  Fixture f;
  SECTION("allowed uids that exclude root refuse root") {
    auto opts = f.Options();
    opts.allowed_uids = {4242};
    opts.allow_root_and_self = false;
    serve::LocalService svc(*f.files, opts);
    REQUIRE(svc.Start().ok());
    const int fds_before = CountFds();
    auto c = Client::Connect(f.socket);
    REQUIRE(c.status().code() == StatusCode::kPermissionDenied);
    REQUIRE(c.status().message().find("uid 0") != std::string::npos);
    // No arena descriptor arrived (the refused socket closes on the service side shortly).
    REQUIRE(Eventually([&] { return CountFds() == fds_before; }));
    REQUIRE(svc.connection_count() == 0);
  }
  SECTION("a root connection is allowed whatever the lists say by default") {
    auto opts = f.Options();
    opts.allowed_uids = {4242};
    serve::LocalService svc(*f.files, opts);
    REQUIRE(svc.Start().ok());
    REQUIRE(Client::Connect(f.socket).ok());
  }
  SECTION("a child running as nobody is refused by the default policy") {
    if (geteuid() != 0) {
      WARN("not root: cannot switch to nobody; skipped");
      return;
    }
    serve::LocalService svc(*f.files, f.Options());
    REQUIRE(svc.Start().ok());
    // Let nobody reach the socket so that the refusal comes from SO_PEERCRED, not the file system.
    REQUIRE(chmod(f.tmp.path().c_str(), 0755) == 0);
    // A world-readable copy: the build tree may lie below a directory nobody cannot traverse.
    const testing::ProgramsForOtherUsers programs({"local_client_helper"});
    std::string out;
    const int rc = testing::RunCommand(
        testing::ShellCommand(programs.As(65534, 65534, {}, "local_client_helper",
                                          {f.socket, "rec", "4", "1", "/nonexistent/marker"})),
        &out);
    INFO(out);
    REQUIRE(out.find("PermissionDenied") != std::string::npos);
    REQUIRE(out.find("uid 65534") != std::string::npos);
    REQUIRE(rc != 0);
    // And root still gets in.
    REQUIRE(Client::Connect(f.socket).ok());
  }
}

TEST_CASE("hostile frames close only the offending connection", "[serve][integration]") {
  Fixture f;
  serve::LocalService svc(*f.files, f.Options());
  REQUIRE(svc.Start().ok());
  auto good = Client::Connect(f.socket);
  REQUIRE(good.ok());
  for (std::string frame : {std::string("\xff\xff\xff\xff", 4), std::string("\x05\x00\x00\x00garbg", 9),
                            std::string("\x02\x00\x00\x00\x50\x01", 6)}) {
    UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strcpy(addr.sun_path, f.socket.c_str());
    REQUIRE(::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
    REQUIRE(::send(fd.get(), frame.data(), frame.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(frame.size()));
    char buf[16];
    // The daemon hangs up (read returns 0 or an error) without answering.
    REQUIRE(::read(fd.get(), buf, sizeof(buf)) <= 0);
  }
  REQUIRE(Eventually([&] { return svc.connection_count() == 1; }));
  LoaderOptions o;
  o.dataset = "rec";
  auto loader = (*good)->OpenLoader(o);
  REQUIRE(loader.ok());
  REQUIRE((*loader)->Next().ok());
}

TEST_CASE("a stale socket is replaced and a live one is not stolen", "[serve][integration]") {
  Fixture f;
  {
    serve::LocalService first(*f.files, f.Options());
    REQUIRE(first.Start().ok());
    serve::LocalService second(*f.files, f.Options());
    auto s = second.Start();
    REQUIRE(s.code() == StatusCode::kFailedPrecondition);
    REQUIRE(s.message().find("another process") != std::string::npos);
  }
  // A socket file left by a crashed daemon.
  {
    UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM, 0));
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strcpy(addr.sun_path, f.socket.c_str());
    REQUIRE(::bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
  }
  serve::LocalService svc(*f.files, f.Options());
  REQUIRE(svc.Start().ok());
  REQUIRE(Client::Connect(f.socket).ok());
}

TEST_CASE("the C API reads an epoch and reports errors as codes with messages",
          "[serve][client][integration]") {
  Fixture f;
  ExpectedSamples expected(f.root + "/rec", *f.records);
  serve::LocalService svc(*f.files, f.Options());
  REQUIRE(svc.Start().ok());
  sc_client* c = nullptr;
  REQUIRE(sc_client_connect(f.socket.c_str(), &c) == SC_OK);
  sc_loader_options o;
  sc_loader_options_init(&o);
  o.dataset = "rec";
  o.batch_size = 64;
  o.shuffle = SC_SHUFFLE_BLOCK;
  sc_loader* l = nullptr;
  REQUIRE(sc_loader_open(c, &o, &l) == SC_OK);
  REQUIRE(sc_loader_record_bytes(l) == 1000);
  uint64_t total = 0;
  sc_batch* b = nullptr;
  int rc;
  while ((rc = sc_loader_next(l, &b)) == SC_OK) {
    REQUIRE(sc_batch_record_bytes(b) == 1000);
    REQUIRE(sc_batch_payload_bytes(b) == 1000 * sc_batch_size(b));
    for (size_t i = 0; i < sc_batch_size(b); ++i) {
      size_t len = 0;
      const uint8_t* p = sc_batch_sample(b, i, &len);
      REQUIRE(p == sc_batch_data(b) + i * 1000);
      REQUIRE(std::string(reinterpret_cast<const char*>(p), len) == expected[sc_batch_sample_id(b, i)]);
    }
    total += sc_batch_size(b);
    sc_batch_release(b);
  }
  REQUIRE(rc == SC_END_OF_EPOCH);
  REQUIRE(total == 1000);
  uint64_t epoch = 9, consumed = 0;
  sc_loader_state(l, &epoch, &consumed);
  REQUIRE(epoch == 0);
  REQUIRE(consumed == 1000);
  o.dataset = "nope";
  sc_loader* bad = nullptr;
  REQUIRE(sc_loader_open(c, &o, &bad) == 5);
  REQUIRE(std::string(sc_last_error()).find("nope") != std::string::npos);
  sc_loader_close(l);
  sc_client_close(c);
  REQUIRE(sc_client_connect((f.tmp.path() + "/none.sock").c_str(), &c) == 14);
}

TEST_CASE("the node's future chunk order is reported for the clairvoyant policy",
          "[serve][integration]") {
  Fixture f;
  std::mutex mu;
  std::vector<std::vector<serve::ChunkAccess>> reports;
  std::vector<std::string> reported_datasets;
  auto opts = f.Options();
  opts.observer_delay_ms = 100;
  // Called on the service's observer thread: it records, the test thread asserts.
  opts.observer = [&](const DatasetPtr& d, const std::vector<serve::ChunkAccess>& order) {
    std::lock_guard<std::mutex> l(mu);
    reported_datasets.push_back(d->name);
    reports.push_back(order);
  };
  serve::LocalService svc(*f.files, opts);
  REQUIRE(svc.Start().ok());
  // Ranks 0 and 2 of a 3-rank job run on this node.
  auto c = Client::Connect(f.socket);
  REQUIRE(c.ok());
  LoaderOptions o;
  o.dataset = "rec";
  o.batch_size = 10;
  o.seed = 4;
  o.epoch = 6;
  o.shuffle = Shuffle::kGlobal;
  o.world_size = 3;
  auto l0 = (*c)->OpenLoader(o);
  o.rank = 2;
  auto l2 = (*c)->OpenLoader(o);
  REQUIRE(l0.ok());
  REQUIRE(l2.ok());
  REQUIRE(Eventually([&] { std::lock_guard<std::mutex> l(mu); return !reports.empty(); }));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));

  // Expected: this epoch's then the next epoch's global order, positions of ranks 0 and 2 only.
  std::vector<serve::ChunkAccess> want;
  for (uint64_t epoch : {6, 7}) {
    plan::PlanOptions po;
    po.seed = 4;
    po.epoch = epoch;
    po.mode = plan::ShuffleMode::kGlobal;
    po.world_size = 3;
    auto p = plan::EpochPlan::Make(plan::LayoutOf(*f.records), po);
    REQUIRE(p.ok());
    for (uint64_t pos = 0; pos < (*p)->dataset_samples(); ++pos) {
      if (pos % 3 == 1) continue;
      const uint64_t id = (*p)->AtPosition(pos);
      const uint32_t shard = static_cast<uint32_t>(id / 250);
      const uint64_t off = (id % 250) * 1000;
      for (uint64_t ch = off / 65536; ch <= (off + 999) / 65536; ++ch) {
        if (!want.empty() && want.back().shard == shard && want.back().chunk == ch) continue;
        want.push_back({shard, ch});
      }
    }
  }
  std::lock_guard<std::mutex> l(mu);
  // The two openings were coalesced into one report covering both ranks.
  REQUIRE(reports.size() == 1);
  CHECK(reported_datasets == std::vector<std::string>{"rec"});
  REQUIRE(reports[0].size() == want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    REQUIRE(reports[0][i].shard == want[i].shard);
    REQUIRE(reports[0][i].chunk == want[i].chunk);
  }
}

TEST_CASE("the node's delivered totals are the sums of the (dataset, rank) series, counted once",
          "[serve][metrics]") {
  // Issue 15: a delivery was counted twice, in the node's total and in its pair's series; the
  // totals (/metrics and /status `clients`) are now rendered from the series.
  auto& reg = metrics::Registry::Global();
  serve::ServeMetrics::Get();
  const serve::DeliveredTotals before = serve::SumDelivered();
  const double batches0 = reg.ValueOf("shardcache_serve_batches_total");
  const double stall0 = reg.ValueOf("shardcache_serve_stall_seconds_total");
  CHECK(batches0 == before.batches);
  const serve::LoaderSeries s = serve::ForLoader("totals-test", 7);
  s.batches->Add(3);
  s.bytes->Add(4096);
  s.stall_us->Add(1500000);
  const serve::DeliveredTotals after = serve::SumDelivered();
  CHECK(after.batches - before.batches == 3);
  CHECK(after.bytes - before.bytes == 4096);
  CHECK(after.stall_us - before.stall_us == 1500000);
  CHECK(reg.ValueOf("shardcache_serve_batches_total") - batches0 == 3);
  CHECK(reg.ValueOf("shardcache_serve_stall_seconds_total") - stall0 == Approx(1.5));
  const std::string text = reg.RenderPrometheus();
  CHECK(text.find("# TYPE shardcache_serve_batches_total counter\nshardcache_serve_batches_total " +
                  std::to_string(after.batches) + "\n") != std::string::npos);
}
