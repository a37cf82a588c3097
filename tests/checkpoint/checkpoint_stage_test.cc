// The node side of checkpoint write-behind: CheckpointStage and CheckpointTransfer against a real
// Origin server (with its ObjectStore) on loopback.
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <random>
#include <thread>

#include <catch2/catch.hpp>
#include <grpcpp/grpcpp.h>

#include "common/fs.h"
#include "common/metrics.h"
#include "daemon/checkpoint/checkpoint_stage.h"
#include "daemon/serve/origin_service.h"
#include "testing/eventually.h"
#include "testing/temp_dir.h"
#include "upstream/origin_fixture.h"

using namespace shardcache;
using namespace shardcache::checkpoint;
using namespace shardcache::testing;

namespace {

std::string RandomBytes(size_t n, uint32_t seed) {
  std::mt19937_64 rng(seed);
  std::string s(n, '\0');
  for (size_t i = 0; i + 8 <= n; i += 8) {
    const uint64_t v = rng();
    std::memcpy(&s[i], &v, 8);
  }
  return s;
}

double Metric(const std::string& name) { return metrics::Registry::Global().ValueOf(name); }

// An origin that takes checkpoints under root for token "tok-run7" (prefix "run7/").
struct Receiver {
  Receiver() {
    auto f = upstream::FileSource::Open(root.path());
    REQUIRE(f.ok());
    files = std::move(*f);
    serve::OriginServiceOptions svc;
    svc.checkpoints.root = root.path() + "/ckpt";
    svc.checkpoints.writers = {{"run7/", "tok-run7"}};
    serve::ServerOptions so;
    so.listen = "127.0.0.1:0";
    auto s = serve::StartOriginServer(*files, so, svc);
    REQUIRE(s.ok());
    server = std::move(*s);
  }
  std::string Target() const { return "127.0.0.1:" + std::to_string(server->port()); }

  TempDir root;
  std::unique_ptr<upstream::FileSource> files;
  std::unique_ptr<serve::OriginServer> server;
};

std::unique_ptr<CheckpointTransfer> TransferTo(const std::string& target, const std::string& token,
                                               uint64_t bandwidth = 0) {
  CheckpointTransferOptions o;
  o.part_bytes = 1 << 20;
  o.max_parallel = 4;
  o.bandwidth_bytes_per_s = bandwidth;
  o.call_timeout = std::chrono::seconds(20);
  UpstreamCalls calls;
  calls.stub = [target](int) {
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(64 << 20);  // a RAW 4 MiB part is a little over gRPC's 4 MiB default
    return v1::Origin::NewStub(grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args));
  };
  calls.add_auth = [token](grpc::ClientContext* ctx) { ctx->AddMetadata("authorization", "Bearer " + token); };
  calls.where = "upstream " + target;
  return std::make_unique<CheckpointTransfer>(o, std::move(calls));
}

std::unique_ptr<CheckpointStage> OpenStage(const std::string& dir, std::unique_ptr<CheckpointTransfer> t) {
  CheckpointStageOptions o;
  o.dir = dir;
  o.keep_local = 1;
  o.retry_min = std::chrono::milliseconds(50);
  o.retry_max = std::chrono::milliseconds(200);
  auto s = CheckpointStage::Open(o, std::move(t));
  REQUIRE(s.ok());
  return std::move(*s);
}

void Save(CheckpointStage& stage, const std::string& name, const std::string& bytes) {
  auto opened = stage.Create(name);
  REQUIRE(opened.ok());
  REQUIRE(PwriteFull(opened->fd.get(), bytes.data(), bytes.size(), 0, name).ok());
  auto size = stage.Commit(opened->handle);
  REQUIRE(size.ok());
  CHECK(*size == bytes.size());
}

std::string StateOf(const CheckpointStage& stage, const std::string& name) {
  auto l = stage.List(name);
  return l.empty() ? "" : l[0].state;
}

}  // namespace

TEST_CASE("a saved checkpoint is durable at once and uploaded in the background, whole under its name only at the end",
          "[checkpoint]") {
  Receiver rx;
  TempDir node;
  auto stage = OpenStage(node.path(), TransferTo(rx.Target(), "tok-run7", 8u << 20));  // 8 MB/s: ~1.2 s
  const std::string bytes = RandomBytes(10u << 20, 1);
  Save(*stage, "run7/step10/rank0.pt", bytes);
  const std::string final_path = rx.root.path() + "/ckpt/run7/step10/rank0.pt";
  CHECK(*ReadFileToString(node.path() + "/objects/run7/step10/rank0.pt") == bytes);
  REQUIRE(Eventually([&] { return StateOf(*stage, "run7/step10/rank0.pt") == "uploading"; }, std::chrono::seconds(5)));
  CHECK(::access(final_path.c_str(), F_OK) != 0);  // not visible while parts are on their way
  REQUIRE(Eventually([&] { return StateOf(*stage, "run7/step10/rank0.pt") == "remote"; }, std::chrono::seconds(30)));
  CHECK(*ReadFileToString(final_path) == bytes);
}

TEST_CASE("an upload stopped by a restart of the node resumes without sending the verified parts again",
          "[checkpoint]") {
  Receiver rx;
  TempDir node;
  const std::string bytes = RandomBytes(16u << 20, 2);
  const double received0 = Metric("shardcache_checkpoint_received_bytes_total");
  {
    auto stage = OpenStage(node.path(), TransferTo(rx.Target(), "tok-run7", 4u << 20));  // 4 MB/s: ~4 s
    Save(*stage, "run7/step20/rank0.pt", bytes);
    REQUIRE(Eventually([&] { return Metric("shardcache_checkpoint_received_bytes_total") - received0 >= (6u << 20); },
                       std::chrono::seconds(20)));
  }  // the daemon stops mid-upload
  const double before_restart = Metric("shardcache_checkpoint_received_bytes_total") - received0;
  CHECK(before_restart < bytes.size());
  auto stage = OpenStage(node.path(), TransferTo(rx.Target(), "tok-run7"));
  REQUIRE(Eventually([&] { return StateOf(*stage, "run7/step20/rank0.pt") == "remote"; }, std::chrono::seconds(30)));
  CHECK(*ReadFileToString(rx.root.path() + "/ckpt/run7/step20/rank0.pt") == bytes);
  // Only parts in flight at the stop (at most `parallel`) may have crossed twice.
  const double total = Metric("shardcache_checkpoint_received_bytes_total") - received0;
  INFO("received before the restart " << before_restart << ", in all " << total);
  CHECK(total <= bytes.size() + 4.0 * (1 << 20));
}

TEST_CASE("a token without the write prefix ends the checkpoint failed with the reason, the local copy kept",
          "[checkpoint]") {
  Receiver rx;
  TempDir node;
  auto stage = OpenStage(node.path(), TransferTo(rx.Target(), "not-a-writer"));
  const std::string bytes = RandomBytes(1u << 20, 3);
  Save(*stage, "run7/step30/rank0.pt", bytes);
  REQUIRE(Eventually([&] { return StateOf(*stage, "run7/step30/rank0.pt") == "failed"; }, std::chrono::seconds(10)));
  const auto info = stage->List("run7/step30/rank0.pt").at(0);
  CHECK_THAT(info.error, Catch::Contains("PermissionDenied"));
  CHECK(info.local);
  CHECK(::access((rx.root.path() + "/ckpt/run7/step30/rank0.pt").c_str(), F_OK) != 0);
}

TEST_CASE("an aborted save and a hostile name leave nothing behind", "[checkpoint]") {
  TempDir node;
  auto stage = OpenStage(node.path(), nullptr);
  auto opened = stage->Create("run7/step40/rank0.pt");
  REQUIRE(opened.ok());
  REQUIRE(::write(opened->fd.get(), "abc", 3) == 3);
  stage->Abort(opened->handle);
  CHECK(stage->List().empty());
  CHECK(::access((node.path() + "/objects/run7/step40/rank0.pt").c_str(), F_OK) != 0);
  CHECK(stage->Commit(opened->handle).status().code() == StatusCode::kNotFound);
  for (const char* bad : {"../escape", "/abs", "a//b", ".hidden", ""}) {
    INFO(bad);
    CHECK(stage->Create(bad).status().code() == StatusCode::kInvalidArgument);
  }
}

TEST_CASE("a checkpoint is read back from the node's copy, or from the upstream on another node", "[checkpoint]") {
  Receiver rx;
  TempDir node_a, node_b;
  const std::string bytes = RandomBytes(3u << 20, 4);
  {
    auto a = OpenStage(node_a.path(), TransferTo(rx.Target(), "tok-run7"));
    Save(*a, "run7/step50/rank0.pt", bytes);
    REQUIRE(Eventually([&] { return StateOf(*a, "run7/step50/rank0.pt") == "remote"; }, std::chrono::seconds(30)));
    auto fd = a->OpenForRead("run7/step50/rank0.pt");
    REQUIRE(fd.ok());
    std::string got(bytes.size(), '\0');
    REQUIRE(PreadFull(fd->get(), got.data(), got.size(), 0, "local").ok());
    CHECK(got == bytes);
  }
  auto b = OpenStage(node_b.path(), TransferTo(rx.Target(), "tok-run7"));
  auto fd = b->OpenForRead("run7/step50/rank0.pt");
  INFO(fd.status().ToString());
  REQUIRE(fd.ok());
  CHECK(*ReadFileToString(node_b.path() + "/objects/run7/step50/rank0.pt") == bytes);
  CHECK(b->OpenForRead("run7/missing.pt").status().code() == StatusCode::kNotFound);
}

TEST_CASE("once uploaded, only the newest keep_local checkpoints of a prefix stay on the node", "[checkpoint]") {
  Receiver rx;
  TempDir node;
  auto stage = OpenStage(node.path(), TransferTo(rx.Target(), "tok-run7"));  // keep_local 1
  Save(*stage, "run7/step1/rank0.pt", RandomBytes(1u << 20, 5));
  REQUIRE(Eventually([&] { return StateOf(*stage, "run7/step1/rank0.pt") == "remote"; }, std::chrono::seconds(30)));
  CHECK(stage->List("run7/step1/rank0.pt").at(0).local);
  std::this_thread::sleep_for(std::chrono::milliseconds(5));  // a later save time
  Save(*stage, "run7/step2/rank0.pt", RandomBytes(1u << 20, 6));
  REQUIRE(Eventually([&] { return StateOf(*stage, "run7/step2/rank0.pt") == "remote"; }, std::chrono::seconds(30)));
  CHECK(stage->List("run7/step2/rank0.pt").at(0).local);
  CHECK_FALSE(stage->List("run7/step1/rank0.pt").at(0).local);  // removed here, kept upstream
  auto fd = stage->OpenForRead("run7/step1/rank0.pt");  // read back from the upstream
  REQUIRE(fd.ok());
  CHECK(*ReadFileToString(node.path() + "/objects/run7/step1/rank0.pt") == RandomBytes(1u << 20, 5));
}
