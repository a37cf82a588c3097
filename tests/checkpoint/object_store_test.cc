// The receiving end of the checkpoint write path (daemon/checkpoint/object_store.h) through a
// real Origin server on loopback: uploads part by part, resumes (also across a restart of the
// server), commits, reads back, and refuses what a writer may not do or a hostile client sends.
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <random>
#include <set>
#include <thread>

#include <catch2/catch.hpp>
#include <grpcpp/grpcpp.h>

#include "common/metrics.h"
#include "daemon/checkpoint/object_name.h"
#include "daemon/serve/origin_service.h"
#include "daemon/upstream/chunk_codec.h"
#include "daemon/upstream/file_source.h"
#include "shardcache/origin.grpc.pb.h"
#include "testing/temp_dir.h"

using namespace shardcache;
using namespace shardcache::testing;
namespace fs = std::filesystem;

namespace {

constexpr char kWriter[] = "run7-writer-token";
constexpr char kOtherWriter[] = "run8-writer-token";
constexpr char kDatasetToken[] = "dataset-token";
constexpr uint32_t kPart = 1 << 20;

// An Origin server whose checkpoints land under `root`: writer tokens for "run7/" and "run8/",
// and a dataset token (which grants no writes). Restart() is a restart of the daemon.
class CheckpointOrigin {
 public:
  explicit CheckpointOrigin(std::string root) : root_(std::move(root)) { Start(); }

  void Restart() {
    stub_.reset();
    server_.reset();
    Start();
  }

  v1::Origin::Stub& stub() { return *stub_; }
  const std::string& root() const { return root_; }

 private:
  void Start() {
    auto files = upstream::FileSource::Open(datasets_.path());
    REQUIRE(files.ok());
    files_ = std::move(*files);
    serve::ServerOptions so;
    so.listen = "127.0.0.1:0";
    so.token = kDatasetToken;
    serve::OriginServiceOptions svc;
    svc.checkpoints.root = root_;
    svc.checkpoints.writers = {{"run7/", kWriter}, {"run8/", kOtherWriter}};
    auto s = serve::StartOriginServer(*files_, so, svc);
    REQUIRE(s.ok());
    server_ = std::move(*s);
    // As shardcached's own channels (GrpcSource): a 4 MiB part sent RAW is just over gRPC's
    // default 4 MiB receive limit.
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(64 << 20);
    stub_ = v1::Origin::NewStub(grpc::CreateCustomChannel("127.0.0.1:" + std::to_string(server_->port()),
                                                          grpc::InsecureChannelCredentials(), args));
  }

  const std::string root_;
  TempDir datasets_;  // empty: no datasets, only checkpoints
  std::unique_ptr<upstream::FileSource> files_;
  std::unique_ptr<serve::OriginServer> server_;
  std::unique_ptr<v1::Origin::Stub> stub_;
};

// A ClientContext carrying `token` as its bearer token ("" = none).
struct Ctx {
  explicit Ctx(const std::string& token) {
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    if (!token.empty()) ctx.AddMetadata("authorization", "Bearer " + token);
  }
  grpc::ClientContext ctx;
};

// `n` bytes; parts of kPart with an even index are compressible text, the others random.
std::string TestBytes(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::string out(n, '\0');
  for (size_t i = 0; i < n; ++i) {
    const bool text = (i / kPart) % 2 == 0;
    out[i] = text ? static_cast<char>('a' + rng() % 4) : static_cast<char>(rng());
  }
  return out;
}

v1::UploadHeader HeaderFor(const std::string& name, const std::string& bytes, uint32_t part_bytes = kPart) {
  v1::UploadHeader h;
  h.set_name(name);
  h.set_size(bytes.size());
  h.set_part_bytes(part_bytes);
  for (size_t off = 0; off < bytes.size(); off += part_bytes) {
    const size_t n = std::min<size_t>(part_bytes, bytes.size() - off);
    h.add_part_hashes(checkpoint::PartHashBytes(bytes.data() + off, n));
  }
  return h;
}

v1::UploadState Begin(CheckpointOrigin& o, const v1::UploadHeader& h) {
  Ctx c(kWriter);
  v1::UploadState st;
  const grpc::Status s = o.stub().BeginUpload(&c.ctx, h, &st);
  INFO(s.error_message());
  REQUIRE(s.ok());
  return st;
}

// Sends part `part` of `bytes` (as zstd when it pays and `zstd`); *codec gets how it travelled.
grpc::Status Put(CheckpointOrigin& o, const v1::UploadHeader& h, const std::string& bytes, uint64_t part,
                 bool zstd = false, v1::Codec* codec = nullptr, const std::string& token = kWriter) {
  v1::PutPartRequest req;
  req.set_name(h.name());
  req.set_upload_id(checkpoint::UploadId(h));
  req.set_part(part);
  const uint64_t off = part * h.part_bytes();
  const uint64_t n = checkpoint::PartLength(h.size(), h.part_bytes(), part);
  upstream::ChunkEncoder encoder;
  v1::Codec c = v1::RAW;
  encoder.Encode(reinterpret_cast<const uint8_t*>(bytes.data() + off), n, zstd, &c, req.mutable_payload());
  req.set_codec(c);
  if (codec != nullptr) *codec = c;
  Ctx ctx(token);
  v1::UploadState st;
  return o.stub().PutPart(&ctx.ctx, req, &st);
}

grpc::Status Commit(CheckpointOrigin& o, const v1::UploadHeader& h, v1::UploadState* st,
                    const std::string& token = kWriter) {
  v1::CommitUploadRequest req;
  req.set_name(h.name());
  req.set_upload_id(checkpoint::UploadId(h));
  Ctx ctx(token);
  return o.stub().CommitUpload(&ctx.ctx, req, st);
}

grpc::Status Stat(CheckpointOrigin& o, const std::string& name, v1::ObjectInfo* info,
                  const std::string& token = kWriter) {
  v1::StatObjectRequest req;
  req.set_name(name);
  Ctx ctx(token);
  return o.stub().StatObject(&ctx.ctx, req, info);
}

grpc::Status ReadPart(CheckpointOrigin& o, const std::string& name, uint32_t part_bytes, uint64_t part,
                      bool zstd, v1::ObjectPart* out, const std::string& token = kWriter) {
  v1::ReadPartRequest req;
  req.set_name(name);
  req.set_part_bytes(part_bytes);
  req.set_part(part);
  req.set_accept_zstd(zstd);
  Ctx ctx(token);
  return o.stub().ReadPart(&ctx.ctx, req, out);
}

// The whole object read back through StatObject and ReadPart, each part checked by its hash.
std::string ReadBack(CheckpointOrigin& o, const std::string& name, bool zstd, int* zstd_parts = nullptr) {
  v1::ObjectInfo info;
  REQUIRE(Stat(o, name, &info).ok());
  CHECK(info.part_bytes() == checkpoint::kReadPartBytes);
  std::string out;
  upstream::ChunkDecoder decoder;
  for (uint64_t p = 0; p < checkpoint::PartCount(info.size(), info.part_bytes()); ++p) {
    v1::ObjectPart part;
    const grpc::Status s = ReadPart(o, name, info.part_bytes(), p, zstd, &part);
    INFO(s.error_message());
    REQUIRE(s.ok());
    if (zstd_parts != nullptr && part.codec() == v1::ZSTD) ++*zstd_parts;
    AlignedBuffer bytes;
    REQUIRE(decoder.Decode(part.codec(), part.payload(), part.raw_bytes(), name, &bytes).ok());
    REQUIRE(checkpoint::PartHashBytes(bytes.data(), bytes.size()) == part.hash());
    out.append(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  }
  return out;
}

std::string FileContents(const std::string& path) {
  auto r = ReadFileToString(path);
  REQUIRE(r.ok());
  return *r;
}

// Every path under `dir`, relative to it.
std::set<std::string> Tree(const std::string& dir) {
  std::set<std::string> out;
  if (!fs::exists(dir)) return out;
  for (const auto& e : fs::recursive_directory_iterator(dir)) out.insert(fs::relative(e.path(), dir).string());
  return out;
}

std::vector<uint64_t> Verified(const v1::UploadState& st) {
  return std::vector<uint64_t>(st.verified_parts().begin(), st.verified_parts().end());
}

double Metric(const std::string& name) { return metrics::Registry::Global().ValueOf(name); }

}  // namespace

TEST_CASE("object names: relative paths of plain components, at most 1024 bytes", "[checkpoint]") {
  for (const char* ok : {"a", "run7/step-1000/rank_3.pt", "run7/x.y.z", "A/B/C/D"}) {
    INFO(ok);
    CHECK(checkpoint::CheckObjectName(ok).ok());
  }
  for (const std::string& bad : std::vector<std::string>{"", "/abs", "../x", "run7/../x", "a//b", "a/", ".hidden", "run7/.x", "a/./b",
                                "a b", "a\\b", std::string("a\0b", 3), "run7/\xc3\xa9"}) {
    INFO(bad);
    CHECK(checkpoint::CheckObjectName(bad).code() == StatusCode::kInvalidArgument);
  }
  CHECK(checkpoint::CheckObjectName("run7/" + std::string(2000, 'x')).code() == StatusCode::kInvalidArgument);
  CHECK(checkpoint::CheckObjectName(std::string(600, 'x') + "/" + std::string(600, 'y')).code() ==
        StatusCode::kInvalidArgument);
}

TEST_CASE("an upload id names the header: same header same id, other bytes another id", "[checkpoint]") {
  const std::string bytes = TestBytes(3 * kPart + 5, 1);
  const v1::UploadHeader h = HeaderFor("run7/a", bytes);
  REQUIRE(checkpoint::CheckUploadHeader(h).ok());
  const std::string id = checkpoint::UploadId(h);
  CHECK(checkpoint::CheckUploadId(id).ok());
  CHECK(checkpoint::UploadId(HeaderFor("run7/a", bytes)) == id);
  std::string other = bytes;
  other[7] ^= 1;
  CHECK(checkpoint::UploadId(HeaderFor("run7/a", other)) != id);
  CHECK(checkpoint::UploadId(HeaderFor("run7/b", bytes)) != id);
  CHECK(checkpoint::CheckUploadId("../../etc/passw").code() == StatusCode::kInvalidArgument);
  CHECK(checkpoint::CheckUploadId(std::string(16, 'G')).code() == StatusCode::kInvalidArgument);
  CHECK(checkpoint::PartHashBytes(bytes.data(), 100) == HashBytes(bytes.data(), 100).ToBytes());
}

TEST_CASE("a multi-part upload is invisible until committed and byte-exact after", "[checkpoint][integration]") {
  TempDir tmp;
  CheckpointOrigin o(tmp / "root");
  const std::string name = "run7/step1000/rank3.pt";
  const std::string final_path = o.root() + "/" + name;
  const std::string bytes = TestBytes(10 * kPart, 2);
  const v1::UploadHeader h = HeaderFor(name, bytes);
  const double received_before = Metric("shardcache_checkpoint_received_bytes_total");
  const double commits_before = Metric("shardcache_checkpoint_commits_total");

  const v1::UploadState begun = Begin(o, h);
  CHECK(begun.upload_id() == checkpoint::UploadId(h));
  CHECK(begun.verified_parts().empty());
  CHECK_FALSE(begun.committed());

  // Four senders at once, as the node's uploader runs them.
  std::atomic<int> zstd_parts{0}, failures{0};
  std::vector<std::thread> senders;
  for (int t = 0; t < 4; ++t) {
    senders.emplace_back([&, t] {
      for (uint64_t p = t; p < 10; p += 4) {
        v1::Codec codec = v1::RAW;
        if (!Put(o, h, bytes, p, /*zstd=*/true, &codec).ok()) failures.fetch_add(1);
        if (codec == v1::ZSTD) zstd_parts.fetch_add(1);
      }
    });
  }
  for (auto& t : senders) t.join();
  REQUIRE(failures.load() == 0);
  CHECK(zstd_parts.load() == 5);  // the text parts

  CHECK_FALSE(fs::exists(final_path));
  v1::ObjectInfo info;
  CHECK(Stat(o, name, &info).error_code() == grpc::StatusCode::NOT_FOUND);

  v1::UploadState st;
  REQUIRE(Commit(o, h, &st).ok());
  CHECK(st.committed());
  CHECK(FileContents(final_path) == bytes);
  // Temp file and sidecar are gone: the directory holds the object alone.
  CHECK(Tree(o.root() + "/run7/step1000") == std::set<std::string>{"rank3.pt"});
  CHECK(Metric("shardcache_checkpoint_received_bytes_total") - received_before == bytes.size());
  CHECK(Metric("shardcache_checkpoint_commits_total") - commits_before == 1);

  int zstd_read = 0;
  CHECK(ReadBack(o, name, /*zstd=*/true, &zstd_read) == bytes);
  CHECK(zstd_read > 0);
  CHECK(ReadBack(o, name, /*zstd=*/false) == bytes);

  SECTION("a commit whose reply was lost: beginning again says committed") {
    CHECK(Begin(o, h).committed());
    CHECK(Tree(o.root() + "/run7/step1000") == std::set<std::string>{"rank3.pt"});
  }
  SECTION("a part arriving after the commit is not written, and the commit is not repeated") {
    CHECK(Put(o, h, bytes, 3).error_code() == grpc::StatusCode::NOT_FOUND);
    v1::UploadState again;
    CHECK(Commit(o, h, &again).error_code() == grpc::StatusCode::NOT_FOUND);
    CHECK(FileContents(final_path) == bytes);
  }
}

TEST_CASE("a resumed upload reports exactly the parts sent, also after a restart", "[checkpoint][integration]") {
  TempDir tmp;
  CheckpointOrigin o(tmp / "root");
  const std::string bytes = TestBytes(8 * kPart + 12345, 3);  // 9 parts, the last short
  const v1::UploadHeader h = HeaderFor("run7/step5/rank0.pt", bytes);
  Begin(o, h);
  for (uint64_t p : {0, 3, 8}) REQUIRE(Put(o, h, bytes, p, /*zstd=*/p == 0).ok());

  CHECK(Verified(Begin(o, h)) == std::vector<uint64_t>{0, 3, 8});

  o.Restart();
  CHECK(Verified(Begin(o, h)) == std::vector<uint64_t>{0, 3, 8});

  // After a restart a sender may go on without beginning again: the sidecar names the upload.
  o.Restart();
  REQUIRE(Put(o, h, bytes, 1).ok());
  CHECK(Verified(Begin(o, h)) == std::vector<uint64_t>{0, 1, 3, 8});

  for (uint64_t p : {2, 4, 5, 6, 7}) REQUIRE(Put(o, h, bytes, p).ok());
  v1::UploadState st;
  REQUIRE(Commit(o, h, &st).ok());
  CHECK(st.committed());
  CHECK(FileContents(o.root() + "/run7/step5/rank0.pt") == bytes);
  CHECK(ReadBack(o, "run7/step5/rank0.pt", true) == bytes);
}

TEST_CASE("a corrupted part is DATA_LOSS, not written and never counted verified", "[checkpoint][integration]") {
  TempDir tmp;
  CheckpointOrigin o(tmp / "root");
  const std::string bytes = TestBytes(4 * kPart, 4);
  const v1::UploadHeader h = HeaderFor("run7/c.pt", bytes);
  Begin(o, h);
  const double bad_before = Metric("shardcache_checkpoint_bad_parts_total");

  std::string corrupt = bytes;
  corrupt[2 * kPart + 100] ^= 0x5a;
  const grpc::Status s = Put(o, h, corrupt, 2);
  CHECK(s.error_code() == grpc::StatusCode::DATA_LOSS);
  CHECK_THAT(s.error_message(), Catch::Contains("part 2 of 'run7/c.pt'"));
  CHECK_THAT(s.error_message(), Catch::Contains(checkpoint::PartHashHex(h.part_hashes(2))));
  CHECK(Metric("shardcache_checkpoint_bad_parts_total") - bad_before == 1);
  CHECK(Verified(Begin(o, h)).empty());

  SECTION("nor does it overwrite the good part already there") {
    REQUIRE(Put(o, h, bytes, 2).ok());
    CHECK(Put(o, h, corrupt, 2).error_code() == grpc::StatusCode::DATA_LOSS);
    CHECK(Verified(Begin(o, h)) == std::vector<uint64_t>{2});
  }
  SECTION("a payload that is no zstd frame of the part, or has the wrong length, is DATA_LOSS") {
    v1::PutPartRequest req;
    req.set_name(h.name());
    req.set_upload_id(checkpoint::UploadId(h));
    req.set_part(1);
    req.set_codec(v1::ZSTD);
    req.set_payload(bytes.substr(kPart, 1000));
    Ctx c1(kWriter);
    v1::UploadState st;
    CHECK(o.stub().PutPart(&c1.ctx, req, &st).error_code() == grpc::StatusCode::DATA_LOSS);
    req.set_codec(v1::RAW);
    req.set_payload(bytes.substr(kPart, kPart - 1));
    Ctx c2(kWriter);
    CHECK(o.stub().PutPart(&c2.ctx, req, &st).error_code() == grpc::StatusCode::DATA_LOSS);
    req.set_codec(static_cast<v1::Codec>(7));
    req.set_payload(bytes.substr(kPart, kPart));
    Ctx c3(kWriter);
    CHECK(o.stub().PutPart(&c3.ctx, req, &st).error_code() == grpc::StatusCode::DATA_LOSS);
    CHECK(Verified(Begin(o, h)).empty());
  }
}

TEST_CASE("a commit with a missing part leaves the upload open and nothing visible", "[checkpoint][integration]") {
  TempDir tmp;
  CheckpointOrigin o(tmp / "root");
  const std::string bytes = TestBytes(6 * kPart, 5);
  const v1::UploadHeader h = HeaderFor("run7/m.pt", bytes);
  Begin(o, h);
  for (uint64_t p : {0, 1, 2, 3, 5}) REQUIRE(Put(o, h, bytes, p).ok());
  v1::UploadState st;
  REQUIRE(Commit(o, h, &st).ok());
  CHECK_FALSE(st.committed());
  CHECK(Verified(st) == std::vector<uint64_t>{0, 1, 2, 3, 5});
  CHECK_FALSE(fs::exists(o.root() + "/run7/m.pt"));

  REQUIRE(Put(o, h, bytes, 4).ok());
  REQUIRE(Commit(o, h, &st).ok());
  CHECK(st.committed());
  CHECK(FileContents(o.root() + "/run7/m.pt") == bytes);
}

TEST_CASE("an empty object has no parts and commits", "[checkpoint][integration]") {
  TempDir tmp;
  CheckpointOrigin o(tmp / "root");
  const v1::UploadHeader h = HeaderFor("run7/empty", "");
  CHECK(Begin(o, h).verified_parts().empty());
  v1::UploadState st;
  REQUIRE(Commit(o, h, &st).ok());
  CHECK(st.committed());
  v1::ObjectInfo info;
  REQUIRE(Stat(o, "run7/empty", &info).ok());
  CHECK(info.size() == 0);
  v1::ObjectPart part;
  CHECK(ReadPart(o, "run7/empty", kPart, 0, false, &part).error_code() == grpc::StatusCode::INVALID_ARGUMENT);
}

TEST_CASE("only the writer of a prefix of the name writes it or reads it back", "[checkpoint][integration]") {
  TempDir tmp;
  CheckpointOrigin o(tmp / "root");
  const std::string bytes = TestBytes(2 * kPart, 6);
  const v1::UploadHeader h = HeaderFor("run7/w.pt", bytes);
  const double refused_before = Metric("shardcache_checkpoint_refused_total");

  for (const std::string& token : {std::string(kOtherWriter), std::string(kDatasetToken), std::string("run7")}) {
    INFO(token);
    Ctx c(token);
    v1::UploadState st;
    const grpc::Status s = o.stub().BeginUpload(&c.ctx, h, &st);
    CHECK(s.error_code() == grpc::StatusCode::PERMISSION_DENIED);
    CHECK_THAT(s.error_message(), Catch::Contains("run7/w.pt"));
  }
  Ctx none("");
  v1::UploadState st;
  CHECK(o.stub().BeginUpload(&none.ctx, h, &st).error_code() == grpc::StatusCode::UNAUTHENTICATED);
  CHECK(Metric("shardcache_checkpoint_refused_total") - refused_before == 4);
  CHECK(Tree(o.root()).empty());

  // A begun upload takes no parts and no commit from another writer.
  Begin(o, h);
  CHECK(Put(o, h, bytes, 0, false, nullptr, kOtherWriter).error_code() == grpc::StatusCode::PERMISSION_DENIED);
  CHECK(Verified(Begin(o, h)).empty());
  REQUIRE(Put(o, h, bytes, 0).ok());
  REQUIRE(Put(o, h, bytes, 1).ok());
  CHECK(Commit(o, h, &st, kOtherWriter).error_code() == grpc::StatusCode::PERMISSION_DENIED);
  CHECK_FALSE(fs::exists(o.root() + "/run7/w.pt"));
  REQUIRE(Commit(o, h, &st).ok());
  REQUIRE(st.committed());

  v1::ObjectInfo info;
  CHECK(Stat(o, h.name(), &info, kOtherWriter).error_code() == grpc::StatusCode::PERMISSION_DENIED);
  v1::ObjectPart part;
  CHECK(ReadPart(o, h.name(), kPart, 0, false, &part, kOtherWriter).error_code() ==
        grpc::StatusCode::PERMISSION_DENIED);
  CHECK(part.payload().empty());
  // The other writer writes its own prefix.
  const v1::UploadHeader theirs = HeaderFor("run8/w.pt", bytes);
  Ctx c(kOtherWriter);
  CHECK(o.stub().BeginUpload(&c.ctx, theirs, &st).ok());
}

TEST_CASE("without checkpoints.root every checkpoint call is FAILED_PRECONDITION", "[checkpoint][integration]") {
  CheckpointOrigin o("");
  const std::string bytes = TestBytes(kPart, 7);
  const v1::UploadHeader h = HeaderFor("run7/x", bytes);
  const auto refused = [](const grpc::Status& s) {
    INFO(s.error_message());
    CHECK(s.error_code() == grpc::StatusCode::FAILED_PRECONDITION);
    CHECK_THAT(s.error_message(), Catch::Contains("checkpoints.root"));
  };
  Ctx c(kWriter);
  v1::UploadState st;
  refused(o.stub().BeginUpload(&c.ctx, h, &st));
  refused(Put(o, h, bytes, 0));
  refused(Commit(o, h, &st));
  v1::ObjectInfo info;
  refused(Stat(o, "run7/x", &info));
  v1::ObjectPart part;
  refused(ReadPart(o, "run7/x", kPart, 0, false, &part));
}

TEST_CASE("hostile names and fields are refused and nothing leaves root", "[checkpoint][integration]") {
  TempDir tmp;
  CheckpointOrigin o(tmp / "root");
  const std::string bytes = TestBytes(2 * kPart, 8);

  for (const std::string& name : std::vector<std::string>{"../x", "/abs", "a//b", ".hidden", "run7/../x", "run7/.hidden", "run7//x",
                                 "run7/", "run7/a b", "run7/" + std::string(2000, 'x')}) {
    INFO(name.substr(0, 40));
    Ctx c(kWriter);
    v1::UploadState st;
    CHECK(o.stub().BeginUpload(&c.ctx, HeaderFor(name, bytes), &st).error_code() ==
          grpc::StatusCode::INVALID_ARGUMENT);
    v1::ObjectInfo info;
    CHECK(Stat(o, name, &info).error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  }

  SECTION("headers that describe no valid upload") {
    std::vector<v1::UploadHeader> bad(6, HeaderFor("run7/h", bytes));
    bad[0].set_part_bytes(1000);
    bad[1].set_part_bytes(8 << 20);
    bad[2].add_part_hashes(std::string(16, '\0'));
    bad[3].set_part_hashes(1, std::string(15, '\0'));
    bad[4].set_size(bytes.size() + 1);
    bad[5].set_size((1ull << 40) + 1);
    for (const auto& h : bad) {
      Ctx c(kWriter);
      v1::UploadState st;
      CHECK(o.stub().BeginUpload(&c.ctx, h, &st).error_code() == grpc::StatusCode::INVALID_ARGUMENT);
    }
  }
  SECTION("parts and commits of uploads that do not exist, or outside the object") {
    const v1::UploadHeader h = HeaderFor("run7/h", bytes);
    Begin(o, h);
    v1::PutPartRequest req;
    req.set_name(h.name());
    req.set_part(0);
    req.set_payload(bytes.substr(0, kPart));
    v1::UploadState st;
    const auto put = [&](const v1::PutPartRequest& r) {
      Ctx c(kWriter);
      return o.stub().PutPart(&c.ctx, r, &st).error_code();
    };
    req.set_upload_id("../../../../tmp/");
    CHECK(put(req) == grpc::StatusCode::INVALID_ARGUMENT);
    req.set_upload_id("0123456789abcdef");
    CHECK(put(req) == grpc::StatusCode::NOT_FOUND);
    req.set_upload_id(checkpoint::UploadId(h));
    req.set_part(2);
    CHECK(put(req) == grpc::StatusCode::INVALID_ARGUMENT);
    req.set_part(~0ull);
    CHECK(put(req) == grpc::StatusCode::INVALID_ARGUMENT);
    req.set_part(0);
    req.set_payload(std::string(3 * kPart, 'x'));
    CHECK(put(req) == grpc::StatusCode::INVALID_ARGUMENT);
    v1::CommitUploadRequest commit;
    commit.set_name("run7/other");
    commit.set_upload_id(checkpoint::UploadId(h));
    Ctx c(kWriter);
    CHECK(o.stub().CommitUpload(&c.ctx, commit, &st).error_code() == grpc::StatusCode::NOT_FOUND);
  }
  SECTION("reads of parts that do not exist") {
    const v1::UploadHeader h = HeaderFor("run7/r", bytes);
    Begin(o, h);
    REQUIRE(Put(o, h, bytes, 0).ok());
    REQUIRE(Put(o, h, bytes, 1).ok());
    v1::UploadState st;
    REQUIRE(Commit(o, h, &st).ok());
    v1::ObjectPart part;
    CHECK(ReadPart(o, "run7/r", 0, 0, false, &part).error_code() == grpc::StatusCode::INVALID_ARGUMENT);
    CHECK(ReadPart(o, "run7/r", 1000, 0, false, &part).error_code() == grpc::StatusCode::INVALID_ARGUMENT);
    CHECK(ReadPart(o, "run7/r", kPart, 2, false, &part).error_code() == grpc::StatusCode::INVALID_ARGUMENT);
    CHECK(ReadPart(o, "run7/nothing", kPart, 0, false, &part).error_code() == grpc::StatusCode::NOT_FOUND);
    CHECK(ReadPart(o, "run7/no/such/dir", kPart, 0, false, &part).error_code() == grpc::StatusCode::NOT_FOUND);
  }
  // Whatever was sent, nothing was created beside root.
  CHECK(Tree(tmp.path()).count("x") == 0);
  for (const auto& p : Tree(tmp.path())) CHECK(p.rfind("root", 0) == 0);
}

TEST_CASE("symbolic links under root are never followed", "[checkpoint][integration]") {
  TempDir tmp;
  CheckpointOrigin o(tmp / "root");
  const std::string outside = tmp / "outside";
  REQUIRE(MakeDirs(outside).ok());
  REQUIRE(MakeDirs(o.root()).ok());
  REQUIRE(::symlink(outside.c_str(), (o.root() + "/run7").c_str()) == 0);
  const std::string bytes = TestBytes(kPart, 9);
  Ctx c(kWriter);
  v1::UploadState st;
  const grpc::Status s = o.stub().BeginUpload(&c.ctx, HeaderFor("run7/x", bytes), &st);
  CHECK(s.error_code() == grpc::StatusCode::FAILED_PRECONDITION);
  CHECK_THAT(s.error_message(), Catch::Contains("symbolic link"));
  CHECK(Tree(outside).empty());

  // A link planted as an object is no object: neither stat nor read follow it.
  REQUIRE(MakeDirs(o.root() + "/run8").ok());
  REQUIRE(WriteFileAtomic(outside + "/secret", "secret").ok());
  REQUIRE(::symlink((outside + "/secret").c_str(), (o.root() + "/run8/link").c_str()) == 0);
  v1::ObjectInfo info;
  CHECK_FALSE(Stat(o, "run8/link", &info, kOtherWriter).ok());
  v1::ObjectPart part;
  CHECK_FALSE(ReadPart(o, "run8/link", kPart, 0, false, &part, kOtherWriter).ok());
  CHECK(part.payload().empty());
}

TEST_CASE("a temp file left by a killed upload never appears under the final name", "[checkpoint][integration]") {
  TempDir tmp;
  CheckpointOrigin o(tmp / "root");
  const std::string name = "run7/step9/rank1.pt";
  const std::string final_path = o.root() + "/" + name;
  const std::string killed = TestBytes(3 * kPart, 10);
  const v1::UploadHeader h = HeaderFor(name, killed);
  Begin(o, h);
  for (uint64_t p = 0; p < 3; ++p) REQUIRE(Put(o, h, killed, p).ok());  // every part, never committed

  o.Restart();
  CHECK_FALSE(fs::exists(final_path));
  v1::ObjectInfo info;
  CHECK(Stat(o, name, &info).error_code() == grpc::StatusCode::NOT_FOUND);
  // Its temp file and sidecar are there, beside the final name and not under it.
  CHECK(Tree(o.root() + "/run7/step9").size() == 2);

  // Another upload under the same name commits its own bytes only.
  const std::string next = TestBytes(2 * kPart + 17, 11);
  const v1::UploadHeader h2 = HeaderFor(name, next);
  CHECK(Begin(o, h2).verified_parts().empty());
  for (uint64_t p = 0; p < 3; ++p) REQUIRE(Put(o, h2, next, p).ok());
  v1::UploadState st;
  REQUIRE(Commit(o, h2, &st).ok());
  REQUIRE(st.committed());
  CHECK(FileContents(final_path) == next);
  o.Restart();
  CHECK(FileContents(final_path) == next);
  CHECK(ReadBack(o, name, true) == next);
}
