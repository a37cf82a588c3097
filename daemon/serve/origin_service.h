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
// Limits: a client is not trusted to be reasonable. At most `max_calls` calls run at once
// (each holds a thread, and a stream an open shard and its queue), at most
// `max_calls_per_client` from one client address; past either, a call fails at once with
// RESOURCE_EXHAUSTED naming the limit. Queued stream messages of all calls together stay under
// `max_queued_bytes` beyond one message per stream (a producer past it waits). When the last
// call ends, freed heap memory goes back to the kernel (ReturnFreeHeapToKernel): a burst of streams does
// not leave its buffers in the process for good.
//
// Checkpoints (origin.proto version 3): BeginUpload, PutPart, CommitUpload, StatObject and
// ReadPart map onto an ObjectStore (daemon/checkpoint/object_store.h) over `checkpoints`. They
// do not take the dataset token: the call's bearer token must be that of a writer whose prefix
// starts the object's name (reading an object back too), checked by ObjectStore::Authorize
// before the call takes a place among those running. Without checkpoints.root every one is
// FAILED_PRECONDITION.
//
// Metrics (metrics::Registry::Global()): shardcache_origin_requests_total{method,code},
// shardcache_origin_chunks_total, shardcache_origin_payload_bytes_total (raw chunk bytes),
// shardcache_origin_wire_bytes_total (payload bytes as sent), shardcache_origin_compression_ratio.
//
// Thread safety: gRPC calls the service from its threads; the destructor waits for producer
// threads, so destroy it only after the server has shut down.
#pragma once

#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "common/mutex.h"
#include "daemon/checkpoint/object_store.h"
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
  // Calls running at once, in all and per client address (IP; one downstream daemon uses up
  // to fetch.max_connections streams, 256 by default, plus a few unary calls; past this cap it
  // is answered RESOURCE_EXHAUSTED and its fetcher settles below it). Default: 1024 and 320.
  uint32_t max_calls = 1024;
  uint32_t max_calls_per_client = 320;
  // Encoded messages queued ahead of the network over all streams, beyond the first of each.
  // Default: 256 MiB.
  uint64_t max_queued_bytes = 256ull << 20;
  // Where checkpoint uploads are committed and who may write them. Default: no root, no
  // writers (checkpoint calls are FAILED_PRECONDITION).
  checkpoint::ObjectStoreOptions checkpoints;
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

  grpc::ServerUnaryReactor* BeginUpload(grpc::CallbackServerContext* ctx, const v1::UploadHeader* req,
                                        v1::UploadState* resp) override;
  grpc::ServerUnaryReactor* PutPart(grpc::CallbackServerContext* ctx, const v1::PutPartRequest* req,
                                    v1::UploadState* resp) override;
  grpc::ServerUnaryReactor* CommitUpload(grpc::CallbackServerContext* ctx, const v1::CommitUploadRequest* req,
                                         v1::UploadState* resp) override;
  grpc::ServerUnaryReactor* StatObject(grpc::CallbackServerContext* ctx, const v1::StatObjectRequest* req,
                                       v1::ObjectInfo* resp) override;
  grpc::ServerUnaryReactor* ReadPart(grpc::CallbackServerContext* ctx, const v1::ReadPartRequest* req,
                                     v1::ObjectPart* resp) override;

  // Calls admitted and not yet ended.
  uint32_t calls_running();

 private:
  class ChunkStream;
  // Authenticates the call and takes a place for it among those running (see Limits above);
  // *client gets the key its place is counted under.
  grpc::Status Admit(const grpc::CallbackServerContext& ctx, std::string* client);
  // Admit without the token check, for calls authorized otherwise (checkpoints).
  grpc::Status TakePlace(const grpc::CallbackServerContext& ctx, std::string* client);
  // One checkpoint call on object `name`: authorizes the writer's token, takes a place, and
  // runs `work` on a thread of its own; its Status finishes the call.
  grpc::ServerUnaryReactor* CheckpointCall(const char* method, grpc::CallbackServerContext* ctx,
                                           const std::string& name, std::function<Status()> work);
  // Runs `fn` on a new thread, counted so the destructor can wait for it, and gives the
  // admitted call's place back when it ends.
  void Spawn(std::string client, std::function<void()> fn);
  // Queued-message accounting across streams (max_queued_bytes).
  bool ReserveQueued(uint64_t bytes, bool first_of_stream);
  void ReleaseQueued(uint64_t bytes);
  // Dataset `name` at `version` ("" = the current one).
  Result<DatasetPtr> OpenVersion(const std::string& name, const std::string& version);

  ChunkSource& source_;
  const OriginServiceOptions options_;
  const BearerTokenCheck auth_;
  ServedVersions versions_;
  checkpoint::ObjectStore store_;
  Mutex mu_;
  CondVar cv_;
  int threads_ GUARDED_BY(mu_) = 0;
  std::map<std::string, uint32_t> calls_by_client_ GUARDED_BY(mu_);
  uint32_t calls_ GUARDED_BY(mu_) = 0;
  uint64_t queued_bytes_ GUARDED_BY(mu_) = 0;
  CondVar queued_cv_;
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
