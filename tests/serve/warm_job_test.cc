// Warm jobs of the local service (WarmDataset / WarmStatus, local protocol 2) over a real Unix
// socket, with a FileSource behind a source that can hold or slow its reads: a job belongs to
// the daemon, not to the connection that started it; one job per dataset; a cap on jobs at once;
// Stop() cancels a running job promptly; version-1 and -2 clients still say Hello.
#include <catch2/catch.hpp>

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <thread>

#include "common/fs.h"
#include "daemon/serve/local_service.h"
#include "daemon/upstream/file_source.h"
#include "shardcache/local.pb.h"
#include "testing/datasets.h"
#include "testing/eventually.h"
#include "testing/temp_dir.h"
#include "testing/forwarding_source.h"
#include "testing/local_conn.h"

using namespace shardcache;
using shardcache::testing::Eventually;
using shardcache::testing::TempDir;

namespace {

// Holds every read until Open() (when `held`), and sleeps `per_chunk` before each chunk.
class GateSource final : public testing::ForwardingSource {
 public:
  GateSource(ChunkSource& inner, bool held, std::chrono::milliseconds per_chunk)
      : ForwardingSource(inner), held_(held), per_chunk_(per_chunk) {}
  Status ReadChunks(const DatasetPtr& d, uint32_t shard, uint64_t first, uint64_t count, const ReadOptions& o,
                    const ChunkSink& sink) override {
    priorities_ok_ = priorities_ok_ && o.priority == FetchPriority::kPrefetch;
    {
      std::unique_lock<std::mutex> l(mu_);
      if (!cv_.wait_until(l, o.deadline, [&] { return !held_; })) return DeadlineExceeded("gate held");
    }
    return inner_.ReadChunks(d, shard, first, count, o, [&](uint64_t c, const ChunkPtr& chunk) {
      std::this_thread::sleep_for(per_chunk_);
      chunks_.fetch_add(1);
      return sink(c, chunk);
    });
  }
  void Open() {
    {
      std::lock_guard<std::mutex> l(mu_);
      held_ = false;
    }
    cv_.notify_all();
  }
  std::atomic<uint64_t> chunks_{0};
  std::atomic<bool> priorities_ok_{true};

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool held_;
  const std::chrono::milliseconds per_chunk_;
};

// A bare control connection (no Hello) with the warm requests.
class Conn : public testing::LocalConn {
 public:
  using LocalConn::LocalConn;
  v1::LocalResponse Warm(const std::string& dataset) {
    v1::LocalRequest req;
    req.mutable_warm_dataset()->set_dataset(dataset);
    return Call(req);
  }
  v1::LocalResponse WarmStatus(uint64_t id) {
    v1::LocalRequest req;
    req.mutable_warm_status()->set_warm_id(id);
    return Call(req);
  }
};

struct WarmFixture {
  TempDir tmp;
  std::string root = tmp.path() + "/data";
  std::string socket = tmp.path() + "/run/sc.sock";
  std::unique_ptr<upstream::FileSource> files;
  dataset::DatasetPtr rec;

  WarmFixture() {
    REQUIRE(MakeDirs(root).ok());
    // 4 shards x 64 records of 1 KiB in 4 KiB chunks: 16 chunks per shard, 64 in all.
    auto r = testing::MakeRecordsDataset(root, "rec", 4, 64, 1024, 4096);
    REQUIRE(r.ok());
    rec = *r;
    REQUIRE(testing::MakeRecordsDataset(root, "other", 1, 16, 1024, 4096, 3).ok());
    auto f = upstream::FileSource::Open(root);
    REQUIRE(f.ok());
    files = std::move(*f);
  }
  serve::LocalServiceOptions Options() const {
    serve::LocalServiceOptions o;
    o.socket_path = socket;
    o.arena_bytes = 1 << 20;
    o.slot_count = 4;
    o.warm.range_chunks = 4;  // 16 ranges: several workers share the dataset
    o.warm.parallel = 4;
    o.warm.range_timeout_ms = 20000;
    return o;
  }
};

}  // namespace

TEST_CASE("a warm job outlives the connection that started it, and a second request joins it",
          "[serve][warm]") {
  WarmFixture f;
  GateSource gate(*f.files, /*held=*/true, std::chrono::milliseconds(0));
  serve::LocalService svc(gate, f.Options());
  REQUIRE(svc.Start().ok());

  uint64_t id = 0;
  {
    Conn c(f.socket);
    auto r = c.Warm("rec");
    REQUIRE(r.code() == 0);
    REQUIRE(r.has_warm_dataset());
    id = r.warm_dataset().warm_id();
    CHECK(id > 0);
    CHECK_FALSE(r.warm_dataset().already_running());
    CHECK(r.warm_dataset().version() == f.rec->version);
    CHECK(r.warm_dataset().total_bytes() == 4 * 64 * 1024);
    CHECK(r.warm_dataset().total_chunks() == 64);
  }  // the client goes away while the job is held
  REQUIRE(Eventually([&] { return svc.connection_count() == 0; }));
  CHECK(svc.running_warm_jobs() == 1);

  Conn c(f.socket);
  auto again = c.Warm("rec");
  REQUIRE(again.code() == 0);
  CHECK(again.warm_dataset().warm_id() == id);
  CHECK(again.warm_dataset().already_running());
  auto st = c.WarmStatus(id);
  REQUIRE(st.code() == 0);
  CHECK_FALSE(st.warm_status().finished());
  CHECK(st.warm_status().done_bytes() == 0);
  CHECK(st.warm_status().dataset() == "rec");

  gate.Open();
  REQUIRE(Eventually([&] { return c.WarmStatus(id).warm_status().finished(); }));
  st = c.WarmStatus(id);
  CHECK(st.warm_status().error_code() == 0);
  CHECK(st.warm_status().done_bytes() == 4 * 64 * 1024);
  CHECK(st.warm_status().done_chunks() == 64);
  // No cache tier in this process: every byte came from the source.
  CHECK(st.warm_status().fetched_bytes() + st.warm_status().cached_bytes() == 4 * 64 * 1024);
  CHECK(gate.chunks_ == 64);
  CHECK(gate.priorities_ok_);  // warm reads never compete with trainers' demand reads
  CHECK(svc.running_warm_jobs() == 0);

  // Once finished, the next request starts a new job.
  auto next = c.Warm("rec");
  REQUIRE(next.code() == 0);
  CHECK(next.warm_dataset().warm_id() != id);
  CHECK_FALSE(next.warm_dataset().already_running());

  // Unknown ids and datasets are refused with their names.
  auto unknown = c.WarmStatus(999999);
  CHECK(unknown.code() == static_cast<uint32_t>(StatusCode::kNotFound));
  CHECK(unknown.message().find("no warm job 999999") != std::string::npos);
  auto nope = c.Warm("nope");
  CHECK(nope.code() == static_cast<uint32_t>(StatusCode::kNotFound));
  CHECK(nope.message().find("warming dataset 'nope'") != std::string::npos);
}

TEST_CASE("warm jobs beyond max_warm_jobs are refused, naming the running ones", "[serve][warm]") {
  WarmFixture f;
  GateSource gate(*f.files, /*held=*/true, std::chrono::milliseconds(0));
  auto o = f.Options();
  o.max_warm_jobs = 1;
  serve::LocalService svc(gate, o);
  REQUIRE(svc.Start().ok());
  Conn c(f.socket);
  REQUIRE(c.Warm("rec").code() == 0);
  auto r = c.Warm("other");
  CHECK(r.code() == static_cast<uint32_t>(StatusCode::kResourceExhausted));
  CHECK(r.message().find("cannot warm 'other'") != std::string::npos);
  CHECK(r.message().find("'rec'") != std::string::npos);
  gate.Open();
  REQUIRE(Eventually([&] { return svc.running_warm_jobs() == 0; }));
  CHECK(c.Warm("other").code() == 0);
}

TEST_CASE("Stop() cancels a running warm job promptly", "[serve][warm]") {
  WarmFixture f;
  // 64 chunks at 50 ms each over 4 workers: ~800 ms of work if left alone.
  GateSource slow(*f.files, /*held=*/false, std::chrono::milliseconds(50));
  serve::LocalService svc(slow, f.Options());
  REQUIRE(svc.Start().ok());
  uint64_t id;
  {
    Conn c(f.socket);
    auto r = c.Warm("rec");
    REQUIRE(r.code() == 0);
    id = r.warm_dataset().warm_id();
    REQUIRE(Eventually([&] { return c.WarmStatus(id).warm_status().done_chunks() > 0; }));
  }
  const auto t0 = std::chrono::steady_clock::now();
  svc.Stop();
  const auto took = std::chrono::steady_clock::now() - t0;
  CHECK(took < std::chrono::milliseconds(400));  // each worker ends after the chunk it is receiving
  const uint64_t read = slow.chunks_.load();
  CHECK(read < 64);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  CHECK(slow.chunks_.load() == read);  // nothing reads after Stop()
}

TEST_CASE("version-1 and -2 clients' Hellos are still accepted", "[serve][warm]") {
  WarmFixture f;
  serve::LocalService svc(*f.files, f.Options());
  REQUIRE(svc.Start().ok());
  for (uint32_t v : {1u, 2u, local_wire::kProtocolVersion}) {
    Conn c(f.socket);
    v1::LocalRequest req;
    req.mutable_hello()->set_protocol_version(v);
    auto r = c.Call(req);
    CHECK(r.code() == 0);
    CHECK(r.hello().protocol_version() == v);
  }
  Conn c(f.socket);
  v1::LocalRequest req;
  req.mutable_hello()->set_protocol_version(local_wire::kProtocolVersion + 1);
  auto r = c.Call(req);
  CHECK(r.code() == static_cast<uint32_t>(StatusCode::kFailedPrecondition));
}
