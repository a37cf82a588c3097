// What loaders of local protocol 5 add, end to end through the C++ client and a real
// LocalService on a Unix socket: DataLoader workers splitting a rank's batches, a job resumed on
// another world size, the fields of tar samples, resumes refused on another dataset version, and
// the request checks that keep hostile OpenLoader fields out.
#include <catch2/catch.hpp>

#include <algorithm>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <map>
#include <set>

#include <sys/wait.h>
#include <unistd.h>

#include "local_fixture.h"
#include "testing/eventually.h"
#include "testing/forwarding_source.h"
#include "testing/local_conn.h"

using namespace shardcache;
using shardcache::testing::ExpectedSamples;
using shardcache::testing::Fixture;
using shardcache::testing::ReadEpoch;

namespace {

LoaderOptions Rank(const std::string& dataset, uint32_t rank, uint32_t world, uint32_t batch,
                   Shuffle mode = Shuffle::kGlobal) {
  LoaderOptions o;
  o.dataset = dataset;
  o.batch_size = batch;
  o.seed = 3;
  o.epoch = 2;
  o.shuffle = mode;
  o.rank = rank;
  o.world_size = world;
  return o;
}

}  // namespace

TEST_CASE("a rank's batches split between workers come back in the rank's order when taken in turn, "
          "with the exact resume point after each",
          "[serve][integration]") {
  Fixture f;
  serve::LocalService svc(*f.files, f.Options());
  REQUIRE(svc.Start().ok());
  ExpectedSamples expected(f.root + "/rec", *f.records);
  auto whole_client = Client::Connect(f.socket);
  REQUIRE(whole_client.ok());
  // 1000 samples on 3 ranks, padded: 334 for rank 1, 21 batches of 16 (the last one of 14).
  const auto whole = ReadEpoch(**whole_client, Rank("rec", 1, 3, 16), expected).batches;
  REQUIRE(whole.size() == 21);
  for (uint32_t workers : {2u, 4u, 25u}) {
    CAPTURE(workers);
    // One client per worker, as DataLoader worker processes each connect.
    std::vector<std::unique_ptr<Client>> clients;
    std::vector<std::unique_ptr<Loader>> loaders;
    for (uint32_t k = 0; k < workers; ++k) {
      auto c = Client::Connect(f.socket);
      REQUIRE(c.ok());
      LoaderOptions o = Rank("rec", 1, 3, 16);
      o.worker = k;
      o.num_workers = workers;
      auto l = (*c)->OpenLoader(o);
      REQUIRE(l.ok());
      REQUIRE((*l)->samples_per_epoch() == 334);
      clients.push_back(std::move(*c));
      loaders.push_back(std::move(*l));
    }
    // torch's DataLoader: one batch from each worker in turn; a worker that is done drops out.
    std::vector<std::vector<uint64_t>> merged;
    uint64_t delivered = 0;
    for (bool any = true; any;) {
      any = false;
      for (auto& l : loaders) {
        auto b = l->Next();
        if (!b.ok()) {
          REQUIRE(b.status().code() == StatusCode::kOutOfRange);
          continue;
        }
        any = true;
        merged.push_back(b->sample_ids());
        delivered += b->size();
        // The resume point a DataLoader records after this batch: everything so far.
        REQUIRE(l->state().samples_consumed == delivered);
      }
    }
    REQUIRE(merged == whole);
  }
}

TEST_CASE("a job resumed on another world size reads the rest of the epoch exactly once", "[serve][integration]") {
  Fixture f;
  serve::LocalService svc(*f.files, f.Options());
  REQUIRE(svc.Start().ok());
  ExpectedSamples expected(f.root + "/rec", *f.records);
  for (auto mode : {Shuffle::kNone, Shuffle::kGlobal, Shuffle::kBlock}) {
    for (uint32_t new_world : {3u, 6u}) {
      CAPTURE(static_cast<int>(mode), new_world);
      auto c = Client::Connect(f.socket);
      REQUIRE(c.ok());
      // 4 ranks read 5 batches of 10 each, then the job stops: rank 0's state is saved.
      std::vector<int> seen(expected.size(), 0);
      LoaderState saved;
      uint32_t window = 0;
      for (uint32_t r = 0; r < 4; ++r) {
        LoaderOptions o = Rank("rec", r, 4, 10, mode);
        o.pad = false;
        auto l = (*c)->OpenLoader(o);
        REQUIRE(l.ok());
        for (int b = 0; b < 5; ++b) {
          auto batch = (*l)->Next();
          REQUIRE(batch.ok());
          for (uint64_t id : batch->sample_ids()) seen[id]++;
        }
        if (r == 0) {
          saved = (*l)->state();
          window = (*l)->block_window_shards();
        }
      }
      REQUIRE(saved.GlobalPosition(expected.size()) == 200);
      // The new job: every rank starts at the global position, with the old plan's window.
      for (uint32_t r = 0; r < new_world; ++r) {
        LoaderOptions o = Rank("rec", r, new_world, 10, mode);
        o.pad = false;
        o.start_position = saved.GlobalPosition(expected.size());
        o.block_window_shards = window;
        for (uint64_t id : ReadEpoch(**c, o, expected).all) seen[id]++;
      }
      REQUIRE(std::all_of(seen.begin(), seen.end(), [](int n) { return n == 1; }));
    }
  }
}

TEST_CASE("tar samples come with their key and fields as views into the batch", "[serve][integration]") {
  Fixture f;
  serve::LocalService svc(*f.files, f.Options());
  REQUIRE(svc.Start().ok());
  auto c = Client::Connect(f.socket);
  REQUIRE(c.ok());
  auto l = (*c)->OpenLoader(Rank("tars", 0, 1, 7));
  REQUIRE(l.ok());
  REQUIRE((*l)->format() == "tar");
  uint64_t samples = 0;
  for (;;) {
    auto b = (*l)->Next();
    if (!b.ok()) {
      INFO(b.status().ToString());
      REQUIRE(b.status().code() == StatusCode::kOutOfRange);
      break;
    }
    REQUIRE(b->has_fields());
    for (size_t i = 0; i < b->size(); ++i) {
      // MakeTarDataset: 40 samples per shard, members "<key>.jpg" and "<key>.cls".
      const uint64_t id = b->sample_id(i), shard = id / 40, k = id % 40;
      REQUIRE(b->key(i) == testing::TarSampleKey(shard, k));
      REQUIRE(b->field_count(i) == 2);
      std::set<std::string> names;
      for (size_t m = 0; m < 2; ++m) {
        const Field fld = b->field(i, m);
        names.insert(std::string(fld.name));
        // Inside the sample's own bytes.
        REQUIRE(fld.bytes.data >= b->sample(i).data);
        REQUIRE(fld.bytes.data + fld.bytes.size <= b->sample(i).data + b->sample(i).size);
      }
      REQUIRE(names == std::set<std::string>{"jpg", "cls"});
      auto jpg = b->field(i, "jpg");
      REQUIRE(jpg.has_value());
      REQUIRE(std::string(reinterpret_cast<const char*>(jpg->data), jpg->size) ==
              testing::TarJpgBytes(1, shard, k, 500, 9000));
      auto cls = b->field(i, "cls");
      REQUIRE(cls.has_value());
      REQUIRE(std::string(reinterpret_cast<const char*>(cls->data), cls->size) == std::to_string(k % 1000));
      REQUIRE(!b->field(i, "png").has_value());
      ++samples;
    }
  }
  REQUIRE(samples == 120);
  // Asked not to: no table, and records datasets never have one.
  LoaderOptions o = Rank("tars", 0, 1, 7);
  o.fields = false;
  auto plain = (*c)->OpenLoader(o);
  REQUIRE(plain.ok());
  auto b = (*plain)->Next();
  REQUIRE(b.ok());
  REQUIRE(!b->has_fields());
  REQUIRE(b->key(0).empty());
  auto rec = (*c)->OpenLoader(Rank("rec", 0, 1, 7));
  REQUIRE(rec.ok());
  auto rb = (*rec)->Next();
  REQUIRE(rb.ok());
  REQUIRE(!rb->has_fields());
}

TEST_CASE("a resume on another dataset version is refused with both versions named", "[serve][integration]") {
  Fixture f;
  serve::LocalService svc(*f.files, f.Options());
  REQUIRE(svc.Start().ok());
  auto c = Client::Connect(f.socket);
  REQUIRE(c.ok());
  LoaderOptions o = Rank("rec", 0, 1, 8);
  o.expect_version = "0123456789abcdef0123456789abcdef";
  auto l = (*c)->OpenLoader(o);
  REQUIRE(!l.ok());
  CHECK(l.status().code() == StatusCode::kFailedPrecondition);
  CHECK(l.status().message().find(o.expect_version) != std::string::npos);
  CHECK(l.status().message().find(f.records->version) != std::string::npos);
  o.expect_version = f.records->version;
  REQUIRE((*c)->OpenLoader(o).ok());
}

TEST_CASE("hostile OpenLoader fields are refused with the field named and the daemon keeps serving",
          "[serve][integration]") {
  Fixture f;
  serve::LocalService svc(*f.files, f.Options());
  REQUIRE(svc.Start().ok());
  testing::LocalConn conn(f.socket);
  conn.Hello(5);
  struct Case {
    const char* field;
    std::function<void(v1::OpenLoaderRequest*)> set;
  };
  const std::vector<Case> cases = {
      // -1 once passed an upper-bound check, became block mode with a window of 0 and looped forever.
      {"shuffle", [](v1::OpenLoaderRequest* r) { r->set_shuffle(static_cast<v1::ShuffleMode>(-1)); }},
      {"shuffle", [](v1::OpenLoaderRequest* r) { r->set_shuffle(static_cast<v1::ShuffleMode>(3)); }},
      {"batch_size", [](v1::OpenLoaderRequest* r) { r->set_batch_size(0); }},
      {"batch_size", [](v1::OpenLoaderRequest* r) { r->set_batch_size(0xffffffffu); }},
      {"world_size", [](v1::OpenLoaderRequest* r) { r->set_world_size(0); }},
      {"rank", [](v1::OpenLoaderRequest* r) { r->set_rank(5); }},
      {"num_workers", [](v1::OpenLoaderRequest* r) { r->set_num_workers(100000); }},
      {"worker", [](v1::OpenLoaderRequest* r) {
         r->set_worker(2);
         r->set_num_workers(2);
       }},
      {"start_position", [](v1::OpenLoaderRequest* r) { r->set_start_position(1001); }},
  };
  for (const Case& k : cases) {
    CAPTURE(k.field);
    v1::LocalRequest req;
    auto* o = req.mutable_open_loader();
    o->set_dataset("rec");
    o->set_batch_size(8);
    o->set_world_size(4);
    o->set_batch_ring(true);
    k.set(o);
    auto r = conn.Call(req);
    CHECK(r.code() == static_cast<uint32_t>(StatusCode::kInvalidArgument));
    CHECK(r.message().find(k.field) != std::string::npos);
  }
  // The connection and the daemon still work.
  REQUIRE(conn.OpenLoader("rec", 8, true).loader_id() > 0);
}

TEST_CASE("a client of local protocol 4 keeps the uneven split; protocol 5 pads every rank to the same count",
          "[serve][integration]") {
  Fixture f;
  serve::LocalService svc(*f.files, f.Options());
  REQUIRE(svc.Start().ok());
  for (uint32_t version : {4u, 5u}) {
    CAPTURE(version);
    testing::LocalConn conn(f.socket);
    conn.Hello(version);
    v1::LocalRequest req;
    auto* o = req.mutable_open_loader();
    o->set_dataset("rec");
    o->set_batch_size(8);
    o->set_world_size(3);
    o->set_rank(2);
    o->set_batch_ring(true);
    auto r = conn.Call(req);
    REQUIRE(r.code() == 0);
    // 1000 samples on 3 ranks: rank 2 has 333 of its own.
    CHECK(r.open_loader().samples_per_epoch() == (version == 4 ? 333u : 334u));
  }
}

TEST_CASE("a forked child (a DataLoader worker) cannot disturb its parent's connection", "[serve][integration]") {
  Fixture f;
  serve::LocalService svc(*f.files, f.Options());
  REQUIRE(svc.Start().ok());
  ExpectedSamples expected(f.root + "/rec", *f.records);
  auto c = Client::Connect(f.socket);
  REQUIRE(c.ok());
  auto l = (*c)->OpenLoader(Rank("rec", 0, 1, 10));
  REQUIRE(l.ok());
  auto first = (*l)->Next();
  REQUIRE(first.ok());
  // Batches wait in the ring, which the child inherits too: it must not take them (the parent
  // would read the same ones).
  REQUIRE(testing::Eventually([&] {
    auto st = (*l)->QueryState();
    return st.ok() && st->samples_consumed > 10;
  }));
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    // The inherited objects refuse to talk, and destroying them sends nothing (no CloseLoader,
    // no release of the parent's batch). Only async-signal-safe exits from here.
    auto next = (*l)->Next();
    const bool refused = !next.ok() && next.status().code() == StatusCode::kFailedPrecondition;
    { auto gone = std::move(*first); }
    l->reset();
    c->reset();
    ::_exit(refused ? 0 : 1);
  }
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  REQUIRE(WIFEXITED(status));
  REQUIRE(WEXITSTATUS(status) == 0);
  // The parent reads on: its loader is open, its batch still held and intact.
  REQUIRE(std::string(reinterpret_cast<const char*>(first->sample(0).data), first->sample(0).size) ==
          expected[first->sample_id(0)]);
  uint64_t samples = first->size();
  CHECK(first->Release().ok());
  for (;;) {
    auto b = (*l)->Next();
    if (!b.ok()) {
      REQUIRE(b.status().code() == StatusCode::kOutOfRange);
      break;
    }
    samples += b->size();
  }
  REQUIRE(samples == 1000);
}

namespace {

// A source whose chunk reads hang until the test lets them go (an upstream that stopped
// answering).
class HangingSource final : public testing::ForwardingSource {
 public:
  using ForwardingSource::ForwardingSource;
  ~HangingSource() override { LetGo(); }
  Status ReadChunks(const DatasetPtr& d, uint32_t shard, uint64_t first, uint64_t count, const ReadOptions& o,
                    const ChunkSink& sink) override {
    std::unique_lock<std::mutex> l(mu_);
    cv_.wait(l, [&] { return released_; });
    return Unavailable("the hanging source was let go");
  }
  void LetGo() {
    {
      std::lock_guard<std::mutex> l(mu_);
      released_ = true;
    }
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool released_ = false;
};

}  // namespace

TEST_CASE("a client that goes away while it waits in NextBatch frees its loaders and slots within 2 s",
          "[serve][integration]") {
  Fixture f;
  HangingSource hanging(*f.files);
  serve::LocalService svc(hanging, f.Options());
  REQUIRE(svc.Start().ok());
  {
    testing::LocalConn conn(f.socket);
    conn.Hello(5);
    conn.OpenLoader("rec", 8, true);
    // Wait for ring entry 0 with a day's timeout (the daemon caps it at 10 minutes): the read
    // never comes back.
    v1::LocalRequest req;
    req.mutable_next_batch()->set_loader_id(1);
    req.mutable_next_batch()->set_timeout_ms(24u * 3600 * 1000);
    req.mutable_next_batch()->set_ring(true);
    conn.Send(req);
    REQUIRE(testing::Eventually([&] { return svc.loader_count() == 1; }));
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }  // the client goes away
  const auto t0 = std::chrono::steady_clock::now();
  // Its assemblies are stuck in the source: the loader goes once they are let go, but the
  // connection, its waiting thread and the arena go now.
  REQUIRE(testing::Eventually([&] { return svc.connection_count() == 0; }, std::chrono::seconds(2)));
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(2));
  hanging.LetGo();
  REQUIRE(testing::Eventually([&] { return svc.loader_count() == 0 && svc.slots_in_use() == 0; }));
}
