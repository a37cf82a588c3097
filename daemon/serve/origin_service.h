// OriginService: the Origin gRPC service over any ChunkSource — a FileSource on the origin, a
// cached GrpcSource on a middle tier or node — so every shardcached speaks the same protocol
// to its downstreams (see proto/shardcache/origin.proto).
//
// A thin mapping between proto and ChunkSource: requests are validated (dataset name, version,
// chunk range → INVALID_ARGUMENT), Status codes map 1:1 onto gRPC codes, and each ReadChunks
// message carries the chunk index, its 16-byte xxh3-128, raw length and a payload that the
// per-stream ChunkEncoder sends as zstd only when that shrinks it.
//
// Sample index and chunk requests name the dataset version they read. Versions this service
// handed out recently are answered from memory (served_versions.h), without opening the dataset
// again, so a downstream keeps reading the version it opened after the dataset was re-indexed;
// any other version is opened afresh and must be the current one (FAILED_PRECONDITION).
//
// Callback API, and reactors never block: the ChunkSource calls (disk reads, upstream fetches)
// run on a thread per call. A ReadChunks producer hands encoded messages to the reactor through
// a queue of `queue_depth` messages and waits when it is full, so a slow client holds back
// reading (backpressure through HTTP/2 flow control) instead of growing memory.
//
// Metrics (metrics::Registry::Global()): shardcache_origin_requests_total{method,code},
// shardcache_origin_chunks_total, shardcache_origin_payload_bytes_total (raw chunk bytes),
// shardcache_origin_wire_bytes_total (payload bytes as sent), shardcache_origin_compression_ratio.
//
// Thread safety: gRPC calls the service from its threads; the destructor waits for producer
// threads, so destroy it only after the server has shut down.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <memory>
#include <mutex>

#include "daemon/serve/grpc_server.h"
#include "daemon/serve/served_versions.h"
#include "daemon/source/chunk_source.h"
#include "daemon/upstream/chunk_codec.h"
#include "shardcache/origin.grpc.pb.h"

namespace shardcache::serve {

struct OriginServiceOptions {
  // Bearer token required from clients; "" = none. Use the server's ServerOptions::token.
  std::string token;
  upstream::ChunkEncoderOptions encoder;
  // Encoded messages a ReadChunks stream may hold ahead of the network.
  size_t queue_depth = 2;
  // Longest a single call may run when the client set no deadline.
  std::chrono::seconds max_call_duration{3600};
};

class OriginService final : public v1::Origin::CallbackService {
 public:
  // `source` must outlive the service.
  OriginService(ChunkSource& source, OriginServiceOptions options = {});
  ~OriginService() override;

  grpc::ServerUnaryReactor* ListDatasets(grpc::CallbackServerContext* ctx,
                                         const v1::ListDatasetsRequest* req,
                                         v1::ListDatasetsResponse* resp) override;
  grpc::ServerUnaryReactor* GetManifest(grpc::CallbackServerContext* ctx,
                                        const v1::GetManifestRequest* req,
                                        v1::GetManifestResponse* resp) override;
  grpc::ServerUnaryReactor* GetSampleIndex(grpc::CallbackServerContext* ctx,
                                           const v1::GetSampleIndexRequest* req,
                                           v1::GetSampleIndexResponse* resp) override;
  grpc::ServerWriteReactor<v1::ChunkMessage>* ReadChunks(grpc::CallbackServerContext* ctx,
                                                         const v1::ReadChunksRequest* req) override;

 private:
  class ChunkStream;
  // Runs `fn` on a new thread, counted so the destructor can wait for it.
  void Spawn(std::function<void()> fn);
  // Dataset `name` at `version` ("" = the current one).
  Result<DatasetPtr> OpenVersion(const std::string& name, const std::string& version);

  ChunkSource& source_;
  const OriginServiceOptions options_;
  const BearerTokenCheck auth_;
  ServedVersions versions_;
  std::mutex mu_;
  std::condition_variable cv_;
  int threads_ = 0;  // GUARDED_BY(mu_)
};

// An Origin server: service + started gRPC server from one set of options.
struct OriginServer {
  std::unique_ptr<OriginService> service;
  std::unique_ptr<GrpcServer> server;
  int port() const { return server->port(); }
  ~OriginServer() {
    if (server) server->Shutdown();
  }
};

// Starts the Origin service for `source` (which must outlive the result) with TLS and token
// from `options` (the token goes to both). Errors as GrpcServer::Start.
Result<std::unique_ptr<OriginServer>> StartOriginServer(ChunkSource& source,
                                                        const ServerOptions& options,
                                                        OriginServiceOptions service_options = {});

// Status → grpc::Status with the same code and message.
grpc::Status ToGrpcStatus(const Status& s);

}  // namespace shardcache::serve
