#include "daemon/fuzz/fuzz_entries.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>

#include "config/config.h"
#include "daemon/admin/admin_server.h"
#include "daemon/checkpoint/object_name.h"
#include "daemon/plan/epoch_plan.h"
#include "daemon/plan/rank_slice.h"
#include "daemon/serve/loader_request.h"
#include "daemon/source/chunk_source.h"
#include "daemon/upstream/chunk_codec.h"
#include "dataset/manifest.h"
#include "shardcache/local.pb.h"
#include "shardcache/origin.pb.h"

namespace shardcache::daemon::fuzz {
namespace {

// 7 shards, 1000 samples of 1 KiB in 64 KiB chunks, uneven like real shards.
const plan::DatasetLayout& FuzzLayout() {
  static const plan::DatasetLayout layout = [] {
    plan::DatasetLayout l;
    l.version = "fuzz";
    l.chunk_bytes = 64 << 10;
    l.shard_samples = {97, 128, 3, 250, 1, 444, 77};
    for (uint64_t n : l.shard_samples) l.shard_bytes.push_back(n * 1024);
    return l;
  }();
  return layout;
}

// Dataset "recs": 2 shards of 160 KiB in 64 KiB chunks (3 chunks each).
DatasetPtr FuzzDataset() {
  static const DatasetPtr d = [] {
    v1::Manifest m;
    m.set_format_version(dataset::kManifestFormatVersion);
    m.set_block_bytes(kChunkBlockBytes);
    m.set_name("recs");
    m.set_format(v1::RECORDS);
    m.set_chunk_bytes(64 << 10);
    m.set_record_bytes(4096);
    for (int i = 0; i < 2; ++i) {
      auto* s = m.add_shards();
      s->set_path("shard-" + std::to_string(i) + ".bin");
      s->set_size_bytes(160 << 10);
      s->set_sample_count(40);
      s->set_chunk_hashes(std::string(3 * 16, '\0'));
    }
    m.set_total_samples(80);
    m.set_total_bytes(320 << 10);
    auto made = dataset::MakeDataset(m.SerializeAsString(), "fuzz", "recs");
    return made.ok() ? *made : nullptr;
  }();
  return d;
}

Status CheckVersion(const std::string& name, const std::string& version, DatasetPtr* out) {
  SC_RETURN_IF_ERROR(CheckDatasetName(name));
  const DatasetPtr d = FuzzDataset();
  if (name != d->name) return NotFound("no dataset '" + name + "'");
  if (!version.empty() && version != d->version) return FailedPrecondition("version " + version + " is not served");
  *out = d;
  return Status::Ok();
}

}  // namespace

Status FuzzLocalRequest(const uint8_t* data, size_t size) {
  v1::LocalRequest req;
  if (!req.ParseFromArray(data, static_cast<int>(size))) return InvalidArgument("malformed LocalRequest");
  if (req.body_case() != v1::LocalRequest::kOpenLoader) return Status::Ok();  // no validation beyond parsing
  SC_ASSIGN_OR_RETURN(serve::LoaderRequest o, serve::CheckOpenLoader(req.open_loader(), 5));
  SC_ASSIGN_OR_RETURN(auto plan, plan::EpochPlan::Make(FuzzLayout(), o.plan));
  SC_ASSIGN_OR_RETURN(plan::RankSlice slice, plan::RankSlice::Make(plan, o.slice));
  const uint64_t n = plan->dataset_samples();
  if (slice.rank_samples() > n) return Internal("a rank of " + std::to_string(slice.rank_samples()) + " samples");
  for (uint64_t i : {uint64_t{0}, slice.size() / 2, slice.size() - 1}) {
    if (i >= slice.size()) continue;
    if (slice.SampleAt(i) >= n) return Internal("sample " + std::to_string(slice.SampleAt(i)) + " outside the dataset");
    if (slice.RankConsumedAfter(i + 1) > slice.rank_samples()) return Internal("resume point past the rank");
  }
  return Status::Ok();
}

Status FuzzOriginRequest(const uint8_t* data, size_t size) {
  if (size == 0) return InvalidArgument("empty input");
  const int kind = data[0];
  const auto* body = data + 1;
  const int len = static_cast<int>(size - 1);
  DatasetPtr d;
  switch (kind) {
    case 0: {
      v1::ReadChunksRequest r;
      if (!r.ParseFromArray(body, len)) return InvalidArgument("malformed ReadChunksRequest");
      SC_RETURN_IF_ERROR(CheckVersion(r.dataset(), r.version(), &d));
      return CheckChunkRange(d, r.shard(), r.first_chunk(), r.chunk_count());
    }
    case 1: {
      v1::GetSampleIndexRequest r;
      if (!r.ParseFromArray(body, len)) return InvalidArgument("malformed GetSampleIndexRequest");
      SC_RETURN_IF_ERROR(CheckVersion(r.dataset(), r.version(), &d));
      if (r.shard() >= static_cast<uint32_t>(d->manifest.shards_size())) return InvalidArgument("no such shard");
      return Status::Ok();
    }
    case 2: {
      v1::GetManifestRequest r;
      if (!r.ParseFromArray(body, len)) return InvalidArgument("malformed GetManifestRequest");
      return CheckVersion(r.dataset(), "", &d);
    }
    case 3: {  // BeginUpload
      v1::UploadHeader r;
      if (!r.ParseFromArray(body, len)) return InvalidArgument("malformed UploadHeader");
      SC_RETURN_IF_ERROR(checkpoint::CheckUploadHeader(r));
      return checkpoint::CheckUploadId(checkpoint::UploadId(r));  // what the receiver names files by
    }
    case 4: {  // PutPart: the fields checked before anything touches a file
      v1::PutPartRequest r;
      if (!r.ParseFromArray(body, len)) return InvalidArgument("malformed PutPartRequest");
      SC_RETURN_IF_ERROR(checkpoint::CheckObjectName(r.name()));
      SC_RETURN_IF_ERROR(checkpoint::CheckUploadId(r.upload_id()));
      upstream::ChunkDecoder decoder;
      AlignedBuffer out;
      return decoder.Decode(r.codec(), r.payload(), checkpoint::kMaxPartBytes, "fuzzed part", &out);
    }
    default:
      return InvalidArgument("unknown request kind " + std::to_string(kind));
  }
}

Status FuzzConfig(const uint8_t* data, size_t size) {
  return config::ParseConfig(std::string(reinterpret_cast<const char*>(data), size), "fuzz").status();
}

Status FuzzAdminRequest(const uint8_t* data, size_t size) {
  static std::once_flag once;
  static std::unique_ptr<admin::AdminServer> server;
  std::call_once(once, [] {
    admin::AdminOptions o;
    o.listen = "127.0.0.1:0";
    o.gpu_metrics = false;
    admin::AdminHandlers h;
    h.status_json = [] { return std::string("{}\n"); };
    h.evict = [](const std::string& name) -> Status {
      SC_RETURN_IF_ERROR(CheckDatasetName(name));
      return NotFound("no dataset '" + name + "'");
    };
    h.ready = [] {
      admin::Readiness r;
      r.serving = true;
      return r;
    };
    h.drain = [] {};
    server = std::make_unique<admin::AdminServer>(o, std::move(h));
    if (!server->Start().ok()) server.reset();
  });
  if (!server) return Unavailable("the admin server did not start");
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Unavailable("socket");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(server->port()));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const timeval limit{1, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof limit);
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &limit, sizeof limit);
  std::string answer;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) {
    (void)!::send(fd, data, size, MSG_NOSIGNAL);
    // A request whose head never ends: say so (half-close), and the server drops it now, not
    // at its read timeout. (A complete one stays open: httplib answers nothing on a half-closed
    // connection.)
    if (std::string_view(reinterpret_cast<const char*>(data), size).find("\r\n\r\n") == std::string_view::npos) {
      ::shutdown(fd, SHUT_WR);
    }
    // Read one answer: its head, then Content-Length bytes of body (the connection may stay
    // open for the next request), or until the server closes or a second passes.
    char buf[4096];
    for (ssize_t r; (r = ::recv(fd, buf, sizeof buf, 0)) > 0;) {
      answer.append(buf, static_cast<size_t>(r));
      const size_t head = answer.find("\r\n\r\n");
      if (head == std::string::npos) continue;
      const size_t cl = answer.find("Content-Length: ");
      const uint64_t body = cl != std::string::npos && cl < head ? std::strtoull(answer.c_str() + cl + 16, nullptr, 10) : 0;
      if (answer.size() >= head + 4 + body) break;
    }
  }
  ::close(fd);
  if (answer.rfind("HTTP/1.1 2", 0) == 0) return Status::Ok();
  return InvalidArgument(answer.empty() ? "no answer" : answer.substr(0, answer.find('\r')));
}

}  // namespace shardcache::daemon::fuzz
