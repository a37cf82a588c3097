// TLS on the Origin service: certificates made with openssl in a temp dir for each run.
#include "testing/process.h"
#include "upstream/origin_fixture.h"

using namespace shardcache;
using namespace shardcache::testing;

namespace {

// CA, a server certificate for 127.0.0.1/localhost, a client certificate from the same CA, and
// an unrelated CA.
struct Pki {
  TempDir dir;
  Pki() {
    const std::string d = dir.path();
    const std::string key = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";
    const std::string script =
        "set -e; cd '" + d + "'\n" +
        "openssl req -x509 " + key + " -keyout ca.key -out ca.pem -days 2 -subj /CN=shardcache-test-ca\n" +
        "openssl req -x509 " + key + " -keyout other.key -out other.pem -days 2 -subj /CN=other-ca\n" +
        "openssl req " + key + " -keyout server.key -out server.csr -subj /CN=localhost\n" +
        "printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\\nextendedKeyUsage=serverAuth\\n' > server.ext\n" +
        "openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out server.pem -days 2 -extfile server.ext\n" +
        "openssl req " + key + " -keyout client.key -out client.csr -subj /CN=node-1\n" +
        "printf 'extendedKeyUsage=clientAuth\\n' > client.ext\n" +
        "openssl x509 -req -in client.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out client.pem -days 2 -extfile client.ext\n";
    std::string out;
    REQUIRE(WriteFileAtomic(d + "/make-pki.sh", script).ok());
    const int rc = RunCommand("bash '" + d + "/make-pki.sh'", &out);
    INFO(out);
    REQUIRE(rc == 0);
  }
  std::string operator/(const std::string& f) const { return dir / f; }
};

serve::ServerOptions TlsServer(const Pki& pki) {
  serve::ServerOptions so;
  so.tls_cert = pki / "server.pem";
  so.tls_key = pki / "server.key";
  return so;
}

upstream::GrpcSourceOptions TlsClient(const OriginFixture& o, const std::string& ca) {
  upstream::GrpcSourceOptions co;
  co.target = "grpcs://" + o.Target();
  co.ca = ca;
  co.call_timeout = std::chrono::milliseconds(2000);
  co.max_retries = 2;
  return co;
}

}  // namespace

TEST_CASE("TLS: a client that trusts the CA is served; others are refused", "[origin][tls]") {
  Pki pki;
  OriginFixture o(TlsServer(pki));
  REQUIRE(o.server->server->tls());

  SECTION("right CA") {
    auto client = o.Client(TlsClient(o, pki / "ca.pem"));
    auto d = client->OpenDataset("recs");
    REQUIRE(d.ok());
    auto c = client->ReadChunk(*d, 0, 2, Within(std::chrono::seconds(10)));
    REQUIRE(c.ok());
    CHECK(ChunkBytes(*c) == FileBytes(o.ShardPath(0), 2 * OriginFixture::kChunk,
                                      OriginFixture::kShardBytes - 2 * OriginFixture::kChunk));
  }
  SECTION("a CA that did not sign the server certificate") {
    auto client = o.Client(TlsClient(o, pki / "other.pem"));
    CHECK(client->OpenDataset("recs").status().code() == StatusCode::kUnavailable);
  }
  SECTION("no CA at all (system roots)") {
    auto client = o.Client(TlsClient(o, ""));
    CHECK(client->OpenDataset("recs").status().code() == StatusCode::kUnavailable);
  }
  SECTION("plaintext against a TLS port") {
    upstream::GrpcSourceOptions co;
    co.target = "grpc://" + o.Target();
    co.call_timeout = std::chrono::milliseconds(2000);
    co.max_retries = 2;
    CHECK(o.Client(co)->OpenDataset("recs").status().code() == StatusCode::kUnavailable);
  }
}

TEST_CASE("TLS with a required client certificate refuses clients without one", "[origin][tls]") {
  Pki pki;
  serve::ServerOptions so = TlsServer(pki);
  so.tls_ca = pki / "ca.pem";
  so.require_client_cert = true;
  so.token = "tok";
  OriginFixture o(so);

  SECTION("certificate and token") {
    auto co = TlsClient(o, pki / "ca.pem");
    co.cert = pki / "client.pem";
    co.key = pki / "client.key";
    co.token = "tok";
    auto client = o.Client(co);
    auto d = client->OpenDataset("recs");
    REQUIRE(d.ok());
    CHECK(client->ReadChunk(*d, 1, 0, Within(std::chrono::seconds(10))).ok());
  }
  SECTION("no client certificate") {
    auto co = TlsClient(o, pki / "ca.pem");
    co.token = "tok";
    CHECK(o.Client(co)->OpenDataset("recs").status().code() == StatusCode::kUnavailable);
  }
  SECTION("a client certificate from another CA") {
    auto co = TlsClient(o, pki / "ca.pem");
    co.cert = pki / "other.pem";
    co.key = pki / "other.key";
    co.token = "tok";
    CHECK(o.Client(co)->OpenDataset("recs").status().code() == StatusCode::kUnavailable);
  }
  SECTION("certificate but no token") {
    auto co = TlsClient(o, pki / "ca.pem");
    co.cert = pki / "client.pem";
    co.key = pki / "client.key";
    CHECK(o.Client(co)->OpenDataset("recs").status().code() == StatusCode::kUnauthenticated);
  }
}

TEST_CASE("bad TLS options are refused before binding", "[origin][tls]") {
  TempDir root;
  auto files = upstream::FileSource::Open(root.path());
  REQUIRE(files.ok());
  serve::ServerOptions so;
  so.listen = "127.0.0.1:0";
  so.tls_cert = "/nonexistent/cert.pem";
  so.tls_key = "/nonexistent/key.pem";
  auto r = serve::StartOriginServer(**files, so);
  CHECK(r.status().code() == StatusCode::kNotFound);
  CHECK_THAT(r.status().message(), Catch::Contains("/nonexistent/cert.pem"));
  so.tls_key.clear();
  CHECK(serve::StartOriginServer(**files, so).status().code() == StatusCode::kInvalidArgument);
  so.tls_cert.clear();
  so.require_client_cert = true;
  CHECK(serve::StartOriginServer(**files, so).status().code() == StatusCode::kInvalidArgument);
}
