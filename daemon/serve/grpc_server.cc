#include "daemon/serve/grpc_server.h"

#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server_builder.h>

#include <openssl/crypto.h>

#include <algorithm>
#include <cstring>

#include <spdlog/spdlog.h>

#include "common/fs.h"

namespace shardcache::serve {
namespace {

Result<std::string> ReadPem(const std::string& value, const char* key) {
  if (value.empty() || value.rfind("-----BEGIN", 0) == 0) return value;
  auto r = ReadFileToString(value);
  if (!r.ok()) return r.status().WithContext(std::string(key));
  return r;
}

}  // namespace

grpc::Status BearerTokenCheck::Check(const grpc::ServerContextBase& ctx) const {
  if (token_.empty()) return grpc::Status::OK;
  const auto& md = ctx.client_metadata();
  auto it = md.find("authorization");
  if (it == md.end()) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                        "this server requires a bearer token (authorization metadata missing)");
  }
  const std::string expected = "Bearer " + token_;
  const grpc::string_ref got = it->second;
  // Compare over the expected length whatever the input, so timing does not leak the token.
  bool same = got.size() == expected.size();
  std::string padded(expected.size(), '\0');
  std::memcpy(padded.data(), got.data(), std::min(got.size(), expected.size()));
  same = (CRYPTO_memcmp(padded.data(), expected.data(), expected.size()) == 0) && same;
  if (!same) return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "bearer token rejected");
  return grpc::Status::OK;
}

Result<std::unique_ptr<GrpcServer>> GrpcServer::Start(const ServerOptions& o,
                                                      const std::vector<grpc::Service*>& services) {
  if (o.listen.empty()) return InvalidArgument("listen address is empty");
  if (o.tls_cert.empty() != o.tls_key.empty()) {
    return InvalidArgument("tls.cert and tls.key must be given together");
  }
  const bool tls = !o.tls_cert.empty();
  if (!tls && (!o.tls_ca.empty() || o.require_client_cert)) {
    return InvalidArgument("tls.ca / tls.require_client_cert need tls.cert and tls.key");
  }
  if (o.require_client_cert && o.tls_ca.empty()) {
    return InvalidArgument("tls.require_client_cert needs tls.ca (the CA client certificates chain to)");
  }
  std::shared_ptr<grpc::ServerCredentials> creds;
  if (tls) {
    SC_ASSIGN_OR_RETURN(std::string cert, ReadPem(o.tls_cert, "tls.cert"));
    SC_ASSIGN_OR_RETURN(std::string key, ReadPem(o.tls_key, "tls.key"));
    SC_ASSIGN_OR_RETURN(std::string ca, ReadPem(o.tls_ca, "tls.ca"));
    grpc::SslServerCredentialsOptions ssl(
        o.require_client_cert ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
        : ca.empty()          ? GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE
                              : GRPC_SSL_REQUEST_CLIENT_CERTIFICATE_AND_VERIFY);
    ssl.pem_root_certs = ca;
    ssl.pem_key_cert_pairs.push_back({key, cert});
    creds = grpc::SslServerCredentials(ssl);
  } else {
    creds = grpc::InsecureServerCredentials();
  }
  std::unique_ptr<GrpcServer> s(new GrpcServer());
  s->tls_ = tls;
  grpc::ServerBuilder b;
  b.AddListeningPort(o.listen, creds, &s->port_);
  b.SetMaxReceiveMessageSize(o.max_message_bytes);
  b.SetMaxSendMessageSize(o.max_message_bytes);
  b.AddChannelArgument(GRPC_ARG_HTTP2_BDP_PROBE, 1);
  b.AddChannelArgument(GRPC_ARG_HTTP2_MAX_FRAME_SIZE, 1 << 20);
  b.AddChannelArgument(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 16 << 20);
  // GrpcSource pings every 10 s while streams run; allow that (default: GOAWAY too_many_pings).
  b.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 5000);
  b.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 0);
  for (grpc::Service* svc : services) b.RegisterService(svc);
  s->server_ = b.BuildAndStart();
  if (!s->server_ || s->port_ == 0) {
    return Unavailable("cannot listen on " + o.listen + " (address in use or not local?)");
  }
  spdlog::info("gRPC server listening on {} (port {}, {}{}{})", o.listen, s->port_,
               tls ? "TLS" : "plaintext", o.require_client_cert ? ", client certificate required" : "",
               o.token.empty() ? "" : ", bearer token required");
  return s;
}

void GrpcServer::Shutdown(std::chrono::milliseconds grace) {
  if (shut_down_ || !server_) return;
  shut_down_ = true;
  server_->Shutdown(std::chrono::system_clock::now() + grace);
  server_->Wait();
}

GrpcServer::~GrpcServer() { Shutdown(); }

}  // namespace shardcache::serve
