// GrpcServer: a started grpc::Server for the TCP-facing services (the Origin service), with
// the transport settings every shardcached shares — TLS from PEM files (optionally requiring a
// client certificate that chains to `tls_ca`), 64 MiB message limits, large HTTP/2 windows
// (BDP probing, 1 MiB frames) and keepalive limits that match GrpcSource's pings.
//
// Bearer tokens: gRPC C++ 1.51 can neither reject a call from a server interceptor nor attach
// an AuthMetadataProcessor to an insecure port, so the token is checked by each service at
// the start of every call through BearerTokenCheck (constant-time compare). Services built
// for a server take the same ServerOptions::token; StartOriginServer (origin_service.h) wires
// both from one ServerOptions.
//
// Thread safety: Start/Shutdown from one owner thread; the server runs on gRPC's threads.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include <grpcpp/server.h>
#include <grpcpp/server_context.h>

#include "common/status.h"

namespace shardcache::serve {

struct ServerOptions {
  // "host:port" to listen on. Port 0 binds a free port; see GrpcServer::port().
  std::string listen;
  // PEM file paths (or PEM text starting with "-----BEGIN"). cert + key enable TLS.
  std::string tls_cert, tls_key;
  // Client CA bundle. With require_client_cert, clients must present a certificate that
  // chains to it; without, a presented certificate is verified but none is required.
  std::string tls_ca;
  bool require_client_cert = false;
  // Bearer token clients must send ("authorization: Bearer <token>"); "" = no token.
  std::string token;
  // Largest message in either direction.
  int max_message_bytes = 64 << 20;
};

// Checks the "authorization" metadata against a token in constant time.
class BearerTokenCheck {
 public:
  explicit BearerTokenCheck(std::string token) : token_(std::move(token)) {}
  bool enabled() const { return !token_.empty(); }
  // OK when disabled or the call carries "Bearer <token>"; UNAUTHENTICATED otherwise (the
  // message never echoes what the client sent).
  grpc::Status Check(const grpc::ServerContextBase& ctx) const;

 private:
  const std::string token_;
};

class GrpcServer {
 public:
  // Validates the options (InvalidArgument naming the bad one), reads the PEM files, builds and
  // starts the server with `services` (which must outlive it). Unavailable when it cannot bind.
  static Result<std::unique_ptr<GrpcServer>> Start(const ServerOptions& options,
                                                   const std::vector<grpc::Service*>& services);
  ~GrpcServer();

  // The bound port (useful with port 0).
  int port() const { return port_; }
  bool tls() const { return tls_; }
  // Stops accepting calls, gives running calls up to `grace`, then cancels them. Idempotent.
  void Shutdown(std::chrono::milliseconds grace = std::chrono::seconds(5));

 private:
  GrpcServer() = default;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  bool tls_ = false;
  bool shut_down_ = false;
};

}  // namespace shardcache::serve
