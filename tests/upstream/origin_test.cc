// The Origin service end to end on loopback: a FileSource served by a real gRPC server, read by
// GrpcSource (and by a raw stub where the client would refuse to send bad input itself).
#include <fcntl.h>
#include <unistd.h>

#include <filesystem>

#include <grpcpp/grpcpp.h>

#include "common/metrics.h"
#include "daemon/cache/cached_source.h"
#include "dataset/indexer.h"
#include "shardcache/origin.grpc.pb.h"
#include "testing/eventually.h"
#include "testing/process.h"
#include "upstream/origin_fixture.h"

using namespace shardcache;
using namespace shardcache::testing;
using Clock = std::chrono::steady_clock;

namespace {

std::unique_ptr<v1::Origin::Stub> RawStub(const std::string& target) {
  return v1::Origin::NewStub(grpc::CreateChannel(target, grpc::InsecureChannelCredentials()));
}

grpc::StatusCode RawRead(v1::Origin::Stub& stub, const v1::ReadChunksRequest& req,
                         const std::string& token = "", int* messages = nullptr) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  if (!token.empty()) ctx.AddMetadata("authorization", token);
  auto reader = stub.ReadChunks(&ctx, req);
  v1::ChunkMessage m;
  int n = 0;
  while (reader->Read(&m)) ++n;
  if (messages) *messages = n;
  return reader->Finish().error_code();
}

Result<std::string> ReadAll(ChunkSource& src, const DatasetPtr& d, uint32_t shard,
                            uint64_t first, uint64_t count, std::vector<uint64_t>* order = nullptr) {
  std::string out;
  Status s = src.ReadChunks(d, shard, first, count, Within(std::chrono::seconds(20)),
                            [&](uint64_t c, const ChunkPtr& chunk) {
                              if (order) order->push_back(c);
                              out += ChunkBytes(chunk);
                              return Status::Ok();
                            });
  if (!s.ok()) return s;
  return out;
}

}  // namespace

TEST_CASE("origin serves chunk ranges that match the files", "[origin][integration]") {
  OriginFixture o;
  auto client = o.Client();
  auto d = client->OpenDataset("recs");
  REQUIRE(d.ok());
  CHECK((*d)->version == o.recs->version);
  CHECK((*d)->manifest_bytes == o.recs->manifest_bytes);
  const std::string shard0 = o.ShardPath(0);
  const uint64_t last_len = OriginFixture::kShardBytes - 2 * OriginFixture::kChunk;

  SECTION("first chunk") {
    auto r = ReadAll(*client, *d, 0, 0, 1);
    REQUIRE(r.ok());
    CHECK(*r == FileBytes(shard0, 0, OriginFixture::kChunk));
  }
  SECTION("middle chunk") {
    auto r = ReadAll(*client, *d, 0, 1, 1);
    REQUIRE(r.ok());
    CHECK(*r == FileBytes(shard0, OriginFixture::kChunk, OriginFixture::kChunk));
  }
  SECTION("last, partial chunk") {
    auto r = ReadAll(*client, *d, 0, 2, 1);
    REQUIRE(r.ok());
    CHECK(r->size() == last_len);
    CHECK(*r == FileBytes(shard0, 2 * OriginFixture::kChunk, last_len));
  }
  SECTION("whole shard, in order") {
    std::vector<uint64_t> order;
    auto r = ReadAll(*client, *d, 1, 0, 3, &order);
    REQUIRE(r.ok());
    CHECK(order == std::vector<uint64_t>{0, 1, 2});
    CHECK(*r == FileBytes(o.ShardPath(1), 0, OriginFixture::kShardBytes));
  }
  SECTION("out of range and unknown shard are InvalidArgument, on the client and on the server") {
    CHECK(ReadAll(*client, *d, 0, 3, 1).status().code() == StatusCode::kInvalidArgument);
    CHECK(ReadAll(*client, *d, 0, 1, 5).status().code() == StatusCode::kInvalidArgument);
    CHECK(ReadAll(*client, *d, 9, 0, 1).status().code() == StatusCode::kInvalidArgument);
    auto stub = RawStub(o.Target());
    v1::ReadChunksRequest req;
    req.set_dataset("recs");
    req.set_shard(0);
    req.set_first_chunk(2);
    req.set_chunk_count(2);
    CHECK(RawRead(*stub, req) == grpc::StatusCode::INVALID_ARGUMENT);
    req.set_shard(5);
    req.set_chunk_count(1);
    CHECK(RawRead(*stub, req) == grpc::StatusCode::INVALID_ARGUMENT);
    req.set_shard(0);
    req.set_first_chunk(0);
    req.set_chunk_count(0);
    CHECK(RawRead(*stub, req) == grpc::StatusCode::INVALID_ARGUMENT);
  }
  SECTION("a stale version is FailedPrecondition") {
    auto stub = RawStub(o.Target());
    v1::ReadChunksRequest req;
    req.set_dataset("recs");
    req.set_version("0123");
    req.set_chunk_count(1);
    CHECK(RawRead(*stub, req) == grpc::StatusCode::FAILED_PRECONDITION);
  }
  SECTION("sample indexes and listings") {
    auto idx = client->GetSampleIndex(*d, 1);
    REQUIRE(idx.ok());
    CHECK(*idx == *ReadFileToString(dataset::SampleIndexPath(o.root / "recs", 1)));
    auto l = client->ListDatasets();
    REQUIRE(l.ok());
    REQUIRE(l->size() == 1);
    CHECK((*l)[0].version() == o.recs->version);
  }
}

TEST_CASE("origin refuses unknown datasets and names that try to leave the root", "[origin][security]") {
  OriginFixture o;
  auto client = o.Client();
  CHECK(client->OpenDataset("missing").status().code() == StatusCode::kNotFound);
  auto stub = RawStub(o.Target());
  for (const char* name : {"..", "../recs", "/etc", "/etc/passwd", "recs/../../x", ".shardcache",
                           "a/../../etc", "recs/.shardcache", "recs//x", "recs/"}) {
    INFO(name);
    grpc::ClientContext ctx;
    v1::GetManifestRequest req;
    req.set_dataset(name);
    v1::GetManifestResponse resp;
    CHECK(stub->GetManifest(&ctx, req, &resp).error_code() == grpc::StatusCode::INVALID_ARGUMENT);
    v1::ReadChunksRequest rr;
    rr.set_dataset(name);
    rr.set_chunk_count(1);
    CHECK(RawRead(*stub, rr) == grpc::StatusCode::INVALID_ARGUMENT);
  }
}

TEST_CASE("bearer token: accepted when right, UNAUTHENTICATED when missing or wrong", "[origin][auth]") {
  serve::ServerOptions so;
  so.token = "s3cret-token";
  OriginFixture o(so);
  auto stub = RawStub(o.Target());
  v1::ReadChunksRequest req;
  req.set_dataset("recs");
  req.set_chunk_count(1);

  SECTION("right token") {
    upstream::GrpcSourceOptions co;
    co.token = "s3cret-token";
    auto client = o.Client(co);
    auto d = client->OpenDataset("recs");
    REQUIRE(d.ok());
    CHECK(ReadAll(*client, *d, 0, 0, 3).ok());
    int n = 0;
    CHECK(RawRead(*stub, req, "Bearer s3cret-token", &n) == grpc::StatusCode::OK);
    CHECK(n == 1);
  }
  SECTION("missing token") {
    auto client = o.Client();
    CHECK(client->OpenDataset("recs").status().code() == StatusCode::kUnauthenticated);
    CHECK(client->ListDatasets().status().code() == StatusCode::kUnauthenticated);
    CHECK(RawRead(*stub, req) == grpc::StatusCode::UNAUTHENTICATED);
  }
  SECTION("wrong token") {
    upstream::GrpcSourceOptions co;
    co.token = "s3cret-tokeX";
    auto client = o.Client(co);
    CHECK(client->OpenDataset("recs").status().code() == StatusCode::kUnauthenticated);
    int n = -1;
    CHECK(RawRead(*stub, req, "Bearer s3cret", &n) == grpc::StatusCode::UNAUTHENTICATED);
    CHECK(n == 0);
    CHECK(RawRead(*stub, req, "s3cret-token") == grpc::StatusCode::UNAUTHENTICATED);
  }
  SECTION("a client with the right token but a dataset read needs it too") {
    // Reading chunks of a dataset learned with the token, through a client without it.
    upstream::GrpcSourceOptions co;
    co.token = "s3cret-token";
    auto d = o.Client(co)->OpenDataset("recs");
    REQUIRE(d.ok());
    auto anonymous = o.Client();
    INFO(ReadAll(*anonymous, *d, 0, 0, 1).status().ToString());
    CHECK(ReadAll(*anonymous, *d, 0, 0, 1).status().code() == StatusCode::kUnauthenticated);
  }
}

TEST_CASE("a corrupt byte in an origin shard reaches the client as DataLoss, never as data",
          "[origin][integrity]") {
  OriginFixture o;
  auto client = o.Client();
  auto d = client->OpenDataset("recs");
  REQUIRE(d.ok());
  {
    UniqueFd fd(::open(o.ShardPath(0).c_str(), O_RDWR));
    char x = 0;
    REQUIRE(::pread(fd.get(), &x, 1, 3) == 1);
    x = static_cast<char>(x ^ 0xff);
    REQUIRE(::pwrite(fd.get(), &x, 1, 3) == 1);
  }
  std::vector<uint64_t> order;
  auto r = ReadAll(*client, *d, 0, 0, 3, &order);
  CHECK(r.status().code() == StatusCode::kDataLoss);
  CHECK_THAT(r.status().message(), Catch::Contains("shard-00000.bin"));
  CHECK(order.empty());
  // The other shard is unaffected.
  CHECK(ReadAll(*client, *d, 1, 0, 3).ok());
}

TEST_CASE("zstd on the wire: compressible chunks shrink, random chunks go RAW", "[origin][codec]") {
  OriginFixture o;
  auto tokens = MakeTokenDataset(o.root.path(), "tokens", 1, 256, 1024, 256 << 10);
  REQUIRE(tokens.ok());
  auto client = o.Client();

  auto dt = client->OpenDataset("tokens");
  REQUIRE(dt.ok());
  const uint64_t bytes = (*dt)->manifest.shards(0).size_bytes();
  auto r = ReadAll(*client, *dt, 0, 0, dataset::ChunkCount((*dt)->manifest, 0));
  REQUIRE(r.ok());
  CHECK(*r == FileBytes(o.root / "tokens/shard-00000.bin", 0, bytes));
  auto s1 = client->stats();
  CHECK(s1.payload_bytes == bytes);
  CHECK(s1.wire_bytes < bytes * 9 / 10);

  auto dr = client->OpenDataset("recs");
  REQUIRE(dr.ok());
  REQUIRE(ReadAll(*client, *dr, 0, 0, 3).ok());
  auto s2 = client->stats();
  CHECK(s2.payload_bytes - s1.payload_bytes == OriginFixture::kShardBytes);
  CHECK(s2.wire_bytes - s1.wire_bytes == OriginFixture::kShardBytes);  // RAW: no gain, no cost

  // The server's metrics saw the same.
  CHECK(metrics::Registry::Global().ValueOf("shardcache_origin_compression_ratio") > 1.0);
}

TEST_CASE("a chunk corrupted in transit is refetched and counted; one that stays corrupt is DataLoss",
          "[origin][integrity]") {
  OriginFixture o({}, /*faulty=*/true);
  upstream::GrpcSourceOptions co;
  co.max_retries = 3;
  auto client = o.Client(co);
  auto d = client->OpenDataset("recs");
  REQUIRE(d.ok());

  SECTION("corrupt twice, then good") {
    o.faults->corrupt_chunk = 1;
    o.faults->corrupt_first = 2;
    auto r = ReadAll(*client, *d, 0, 0, 3);
    REQUIRE(r.ok());
    CHECK(*r == FileBytes(o.ShardPath(0), 0, OriginFixture::kShardBytes));
    CHECK(client->stats().checksum_failures == 2);
    CHECK(client->stats().retries == 2);
  }
  SECTION("corrupt every time") {
    o.faults->corrupt_chunk = 2;
    o.faults->corrupt_first = 1000;
    std::vector<uint64_t> order;
    auto r = ReadAll(*client, *d, 0, 0, 3, &order);
    CHECK(r.status().code() == StatusCode::kDataLoss);
    CHECK_THAT(r.status().message(), Catch::Contains("chunk 2"));
    CHECK(order == std::vector<uint64_t>{0, 1});
    CHECK(client->stats().checksum_failures == 4);
  }
}

TEST_CASE("16 concurrent readers of one cold chunk cause one upstream fetch", "[origin][single_flight]") {
  OriginFixture o({}, /*faulty=*/true);
  o.faults->delay_ms = 300;
  auto client = o.Client();
  auto d = client->OpenDataset("recs");
  REQUIRE(d.ok());
  std::vector<std::thread> readers;
  std::atomic<int> ok{0};
  const std::string want = FileBytes(o.ShardPath(1), OriginFixture::kChunk, OriginFixture::kChunk);
  for (int i = 0; i < 16; ++i) {
    readers.emplace_back([&] {
      auto c = client->ReadChunk(*d, 1, 1, Within(std::chrono::seconds(10)));
      if (c.ok() && ChunkBytes(*c) == want) ok.fetch_add(1);
    });
  }
  for (auto& t : readers) t.join();
  CHECK(ok.load() == 16);
  CHECK(o.faults->read_calls.load() == 1);
  CHECK(client->stats().streams == 1);
}

TEST_CASE("demand fetches start before queued prefetches", "[origin][priority]") {
  OriginFixture o({}, /*faulty=*/true);
  o.faults->delay_ms = 150;
  upstream::GrpcSourceOptions co;
  co.connections = 1;
  co.max_connections = 1;
  co.chunks_per_stream = 1;
  auto client = o.Client(co);
  auto d = client->OpenDataset("recs");
  REQUIRE(d.ok());
  std::mutex mu;
  std::vector<std::string> finished;
  auto read = [&](const char* name, uint32_t shard, uint64_t chunk, FetchPriority p) {
    ReadOptions ro = Within(std::chrono::seconds(10));
    ro.priority = p;
    auto c = client->ReadChunk(*d, shard, chunk, ro);
    std::lock_guard<std::mutex> lock(mu);
    finished.push_back(c.ok() ? name : std::string("failed ") + name);
  };
  std::thread busy(read, "busy", 0, 0, FetchPriority::kPrefetch);  // takes the only stream
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  std::thread prefetch(read, "prefetch", 0, 1, FetchPriority::kPrefetch);
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  std::thread demand(read, "demand", 0, 2, FetchPriority::kDemand);
  busy.join();
  prefetch.join();
  demand.join();
  CHECK(finished == std::vector<std::string>{"busy", "demand", "prefetch"});
}

TEST_CASE("a demand read does not wait for a prefetch stream that holds the whole stream limit",
          "[origin][priority]") {
  // One stream allowed; a prefetch of 3 slow chunks (~450 ms) holds it. The demand read runs on
  // one of the demand lanes past the limit and finishes first.
  OriginFixture o({}, /*faulty=*/true);
  o.faults->delay_ms = 150;
  upstream::GrpcSourceOptions co;
  co.connections = 1;
  co.max_connections = 4;
  co.chunks_per_stream = 3;
  auto client = o.Client(co);
  auto d = client->OpenDataset("recs");
  REQUIRE(d.ok());
  std::mutex mu;
  std::vector<std::string> finished;
  auto done = [&](const std::string& name) {
    std::lock_guard<std::mutex> lock(mu);
    finished.push_back(name);
  };
  std::thread busy([&] {
    ReadOptions ro = Within(std::chrono::seconds(10));
    ro.priority = FetchPriority::kPrefetch;
    Status s = client->ReadChunks(*d, 0, 0, 3, ro, [](uint64_t, const ChunkPtr&) { return Status::Ok(); });
    done(s.ok() ? "busy" : "failed busy");
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  std::thread demand([&] {
    auto c = client->ReadChunk(*d, 1, 2, Within(std::chrono::seconds(10)));
    done(c.ok() ? "demand" : "failed demand");
  });
  busy.join();
  demand.join();
  CHECK(finished == std::vector<std::string>{"demand", "busy"});
}

TEST_CASE("a dead upstream fails with Unavailable at the caller's deadline", "[origin][faults]") {
  const int port = FreePort();
  upstream::GrpcSourceOptions co;
  co.target = "127.0.0.1:" + std::to_string(port);
  co.call_timeout = std::chrono::milliseconds(1000);
  co.backoff_initial = std::chrono::milliseconds(20);
  co.max_retries = 1000;
  auto client = upstream::GrpcSource::Create(co);
  REQUIRE(client.ok());
  const auto t0 = Clock::now();
  auto d = (*client)->OpenDataset("recs");
  CHECK(d.status().code() == StatusCode::kUnavailable);

  // Chunk reads with a dataset learned before the upstream died.
  OriginFixture o;
  auto live = o.Client();
  auto known = live->OpenDataset("recs");
  REQUIRE(known.ok());
  const auto t1 = Clock::now();
  std::string ignored;
  Status s = (*client)->ReadChunks(*known, 0, 0, 3, Within(std::chrono::milliseconds(1500)),
                                   [&](uint64_t, const ChunkPtr&) { return Status::Ok(); });
  const double waited = std::chrono::duration<double>(Clock::now() - t1).count();
  CHECK(s.code() == StatusCode::kUnavailable);
  CHECK(waited >= 1.4);
  CHECK(waited < 4.0);
  (void)t0;
}

TEST_CASE("the last known manifest is served while the upstream is unreachable", "[origin][faults]") {
  auto o = std::make_unique<OriginFixture>();
  upstream::GrpcSourceOptions co;
  co.manifest_ttl = std::chrono::milliseconds(0);
  co.call_timeout = std::chrono::milliseconds(500);
  co.max_retries = 1;
  auto client = o->Client(co);
  auto a = client->OpenDataset("recs");
  REQUIRE(a.ok());
  o->server->server->Shutdown(std::chrono::milliseconds(0));
  auto b = client->OpenDataset("recs");
  REQUIRE(b.ok());
  CHECK((*b)->version == (*a)->version);
}

TEST_CASE("a nested dataset name is served end to end through the Origin service", "[origin][names]") {
  OriginFixture o;
  auto train = MakeRecordsDataset(o.root.path(), "laion/train", 2, 40, 4096, OriginFixture::kChunk, 9);
  REQUIRE(train.ok());
  auto client = o.Client();
  auto d = client->OpenDataset("laion/train");
  REQUIRE(d.ok());
  CHECK((*d)->name == "laion/train");
  CHECK((*d)->version == (*train)->version);
  auto r = ReadAll(*client, *d, 1, 0, 3);
  REQUIRE(r.ok());
  CHECK(*r == FileBytes(o.root / "laion/train/shard-00001.bin", 0, OriginFixture::kShardBytes));
  auto idx = client->GetSampleIndex(*d, 0);
  REQUIRE(idx.ok());
  CHECK(*idx == *ReadFileToString(dataset::SampleIndexPath(o.root / "laion/train", 0)));
  auto l = client->ListDatasets();
  REQUIRE(l.ok());
  REQUIRE(l->size() == 2);
  CHECK((*l)[0].name() == "laion/train");
  CHECK((*l)[1].name() == "recs");
  CHECK(client->OpenDataset("laion").status().code() == StatusCode::kNotFound);
}

TEST_CASE("a dataset re-indexed at the origin is seen by the next open; a dataset opened before keeps its version",
          "[origin][reindex]") {
  OriginFixture o;
  // A node's stack: the cache tiers (memory only here) over a GrpcSource with the default
  // revalidation interval.
  upstream::GrpcSourceOptions co;
  REQUIRE(co.manifest_ttl <= std::chrono::milliseconds(1000));
  auto node = cache::CachedSource::Open(cache::CacheOptions(), o.Client(co));
  REQUIRE(node.ok());
  auto before = (*node)->OpenDataset("recs");
  REQUIRE(before.ok());
  REQUIRE((*before)->manifest.chunk_bytes() == OriginFixture::kChunk);

  // shardctl index again, with half the chunk size: same shard files, a new manifest.
  dataset::IndexOptions io;
  io.record_bytes = 4096;
  io.chunk_bytes = OriginFixture::kChunk / 2;
  auto reindexed = dataset::IndexDirectory(o.root / "recs", io);
  REQUIRE(reindexed.ok());
  REQUIRE((*reindexed)->version != (*before)->version);

  std::this_thread::sleep_for(co.manifest_ttl + std::chrono::milliseconds(100));
  auto after = (*node)->OpenDataset("recs");
  REQUIRE(after.ok());
  CHECK((*after)->version == (*reindexed)->version);
  CHECK((*after)->manifest.chunk_bytes() == OriginFixture::kChunk / 2);
  CHECK((*before)->manifest.chunk_bytes() == OriginFixture::kChunk);

  // The dataset opened before still reads — chunks in its own chunking and its sample
  // indexes — though the origin now serves the new version (the old code: FailedPrecondition).
  auto old_bytes = ReadAll(**node, *before, 0, 0, 3);
  REQUIRE(old_bytes.ok());
  CHECK(*old_bytes == FileBytes(o.ShardPath(0), 0, OriginFixture::kShardBytes));
  CHECK((*node)->GetSampleIndex(*before, 1).ok());
  auto new_bytes = ReadAll(**node, *after, 0, 0, 5);
  REQUIRE(new_bytes.ok());
  CHECK(*new_bytes == *old_bytes);
}

TEST_CASE("opens that arrive together share one manifest request", "[origin][reindex]") {
  OriginFixture o({}, /*faulty=*/true);
  upstream::GrpcSourceOptions co;
  co.manifest_ttl = std::chrono::milliseconds(0);  // every open revalidates
  auto client = o.Client(co);
  o.faults->open_delay_ms = 300;
  const int before = o.faults->open_calls.load();
  std::vector<std::thread> threads;
  std::atomic<int> ok{0};
  for (int i = 0; i < 16; ++i) {
    threads.emplace_back([&] {
      if (client->OpenDataset("recs").ok()) ok.fetch_add(1);
    });
  }
  for (auto& t : threads) t.join();
  CHECK(ok.load() == 16);
  CHECK(o.faults->open_calls.load() - before == 1);
}

namespace {

int ThreadCount() {
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/task")) n += e.is_directory();
  return n;
}

}  // namespace

TEST_CASE("a client opening 400 streams it never reads gets RESOURCE_EXHAUSTED past its limit, and the origin's "
          "threads stay bounded",
          "[origin][limits]") {
  serve::OriginServiceOptions svc;
  svc.max_calls = 64;
  svc.max_calls_per_client = 32;
  OriginFixture o({}, /*faulty=*/true, svc);
  o.faults->delay_ms = 1000;  // a stream admitted stays open ~3 s: its producer waits on each chunk
  const int threads_before = ThreadCount();
  auto stub = RawStub(o.Target());
  v1::ReadChunksRequest req;
  req.set_dataset("recs");
  req.set_chunk_count(3);
  std::vector<std::unique_ptr<grpc::ClientContext>> ctxs;
  std::vector<std::unique_ptr<grpc::ClientReader<v1::ChunkMessage>>> readers;
  for (int i = 0; i < 400; ++i) {
    ctxs.push_back(std::make_unique<grpc::ClientContext>());
    ctxs.back()->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    readers.push_back(stub->ReadChunks(ctxs.back().get(), req));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  // A thread per admitted stream at most, plus gRPC's own.
  CHECK(o.server->service->calls_running() <= 32);
  CHECK(ThreadCount() - threads_before < 32 + 24);
  int exhausted = 0, ok = 0;
  std::string message;
  for (size_t i = 0; i < readers.size(); ++i) {
    v1::ChunkMessage m;
    while (readers[i]->Read(&m)) {
    }
    const grpc::Status s = readers[i]->Finish();
    if (s.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) {
      ++exhausted;
      message = s.error_message();
    } else {
      CHECK(s.ok());
      ++ok;
    }
  }
  // Requests the channel held back until earlier streams ended may have found a place then.
  CHECK(exhausted >= 200);
  CHECK(ok >= 32);
  CHECK(message.find("limit") != std::string::npos);
  // The places come back: a new stream is served once the others ended.
  o.faults->delay_ms = 0;
  REQUIRE(Eventually([&] {
    return RawRead(*stub, req) == grpc::StatusCode::OK;
  }, std::chrono::seconds(20)));
}

TEST_CASE("the stream pool makes threads and connections when work needs them and releases them when idle",
          "[origin][pool]") {
  OriginFixture o({}, /*faulty=*/true);
  o.faults->delay_ms = 100;
  upstream::GrpcSourceOptions co;
  co.connections = 4;
  co.idle_release = std::chrono::milliseconds(300);
  auto client = o.Client(co);
  auto d = client->OpenDataset("recs");
  REQUIRE(d.ok());
  // Opening a dataset starts connecting the slots a first batch would take; no thread yet.
  CHECK(client->stats().workers == 0);
  CHECK(client->stats().open_connections == co.connections + upstream::GrpcSource::kDemandLanes);
  std::atomic<int> exact{0};
  std::vector<std::thread> readers;
  for (uint32_t shard = 0; shard < 2; ++shard) {
    readers.emplace_back([&, shard] {
      const std::string file = FileBytes(o.ShardPath(static_cast<int>(shard)), 0, OriginFixture::kShardBytes);
      Status s = client->ReadChunks(*d, shard, 0, 3, Within(std::chrono::seconds(10)),
                                    [&](uint64_t c, const ChunkPtr& chunk) {
                                      if (ChunkBytes(chunk) == file.substr(c * OriginFixture::kChunk,
                                                                           chunk->bytes.size())) {
                                        exact.fetch_add(1);
                                      }
                                      return Status::Ok();
                                    });
      CHECK(s.ok());
    });
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  const auto busy = client->stats();
  CHECK(busy.workers >= 1);
  CHECK(busy.workers <= busy.stream_limit + upstream::GrpcSource::kDemandLanes);  // demand reads
  for (auto& t : readers) t.join();
  CHECK(exact.load() == 6);
  CHECK(client->stats().in_flight_bytes == 0);
  // Idle for idle_release: the workers exit and the prober closes their connections.
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while ((client->stats().workers > 0 || client->stats().open_connections > 0) &&
         std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  CHECK(client->stats().workers == 0);
  CHECK(client->stats().open_connections == 0);
  // And the pool grows again for the next read.
  auto again = client->ReadChunk(*d, 1, 2, Within(std::chrono::seconds(10)));
  REQUIRE(again.ok());
  CHECK(ChunkBytes(*again) == FileBytes(o.ShardPath(1), 2 * OriginFixture::kChunk, OriginFixture::kShardBytes -
                                                                                  2 * OriginFixture::kChunk));
}

TEST_CASE("an in-flight budget smaller than one chunk still delivers every range byte-exact", "[origin][pool]") {
  OriginFixture o;
  upstream::GrpcSourceOptions co;
  co.max_in_flight_bytes = 1;
  auto client = o.Client(co);
  auto d = client->OpenDataset("recs");
  REQUIRE(d.ok());
  std::vector<std::thread> readers;
  std::atomic<int> exact{0};
  for (int i = 0; i < 4; ++i) {
    readers.emplace_back([&, shard = static_cast<uint32_t>(i % 2)] {
      const std::string file = FileBytes(o.ShardPath(static_cast<int>(shard)), 0, OriginFixture::kShardBytes);
      std::string got;
      Status s = client->ReadChunks(*d, shard, 0, 3, Within(std::chrono::seconds(10)),
                                    [&](uint64_t, const ChunkPtr& chunk) {
                                      got += ChunkBytes(chunk);
                                      return Status::Ok();
                                    });
      if (s.ok() && got == file) exact.fetch_add(1);
    });
  }
  for (auto& t : readers) t.join();
  CHECK(exact.load() == 4);
  CHECK(client->stats().in_flight_bytes == 0);
}

TEST_CASE("an origin that caps our calls lowers the stream limit, and every chunk still arrives", "[origin][pool]") {
  serve::OriginServiceOptions svc;
  svc.max_calls_per_client = 3;  // our unary calls ride the control connection: 2 streams fit
  OriginFixture o({}, /*faulty=*/true, svc);
  o.faults->delay_ms = 100;
  upstream::GrpcSourceOptions co;
  co.connections = 8;
  co.max_connections = 8;
  auto client = o.Client(co);
  auto d = client->OpenDataset("recs");
  REQUIRE(d.ok());
  std::vector<std::thread> readers;
  std::atomic<int> exact{0};
  for (int i = 0; i < 6; ++i) {
    readers.emplace_back([&, shard = static_cast<uint32_t>(i % 2), chunk = static_cast<uint64_t>(i / 2)] {
      auto c = client->ReadChunk(*d, shard, chunk, Within(std::chrono::seconds(20)));
      const uint64_t len = std::min(OriginFixture::kChunk, OriginFixture::kShardBytes - chunk * OriginFixture::kChunk);
      if (c.ok() && ChunkBytes(*c) == FileBytes(o.ShardPath(static_cast<int>(shard)), chunk * OriginFixture::kChunk, len)) {
        exact.fetch_add(1);
      }
    });
  }
  for (auto& t : readers) t.join();
  CHECK(exact.load() == 6);
  CHECK(client->stats().stream_limit <= 3);
}
