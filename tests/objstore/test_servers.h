// Real servers on loopback for the objstore tests, each started by the test that needs it and
// killed on scope exit: s3rver (an S3-protocol server from npm), nginx (plain http and https
// with a self-signed certificate made by openssl), and fault_server.py (scripted faults).
// A missing server program fails the test with a message saying to run `make setup`.
#pragma once

#include <memory>
#include <string>

#include "objstore/object_client.h"
#include "testing/process.h"
#include "testing/temp_dir.h"

namespace shardcache::objstore::testing {

// s3rver on 127.0.0.1 with the bucket `bucket` created at start-up. It accepts the access key
// S3RVER (secret S3RVER); it checks the access key id but, in version 3, not SigV4 signatures.
class S3rver {
 public:
  // `service_endpoint`: the domain virtual-host requests name (BUCKET.s3.DOMAIN); "" = s3rver's.
  explicit S3rver(const std::string& bucket = "test-bucket", const std::string& service_endpoint = "");
  std::string endpoint() const { return "http://127.0.0.1:" + std::to_string(port_); }
  int port() const { return port_; }

 private:
  shardcache::testing::TempDir dir_;
  int port_ = 0;
  std::unique_ptr<shardcache::testing::Process> proc_;
};

// nginx serving `root` over http and https (certificate for 127.0.0.1 in ca_file()).
class Nginx {
 public:
  explicit Nginx(const std::string& root);
  std::string http_origin() const { return "http://127.0.0.1:" + std::to_string(http_port_); }
  std::string https_origin() const { return "https://127.0.0.1:" + std::to_string(https_port_); }
  std::string ca_file() const { return dir_ / "cert.pem"; }

 private:
  shardcache::testing::TempDir dir_;
  int http_port_ = 0;
  int https_port_ = 0;
  std::unique_ptr<shardcache::testing::Process> proc_;
};

// tests/objstore/fault_server.py in `mode` (see the script) serving objects of `size` bytes.
class FaultServer {
 public:
  FaultServer(const std::string& mode, size_t size);
  std::string endpoint() const { return "http://127.0.0.1:" + std::to_string(port_); }
  // Requests seen so far, one line each: "GET /bucket/key bytes=START-END".
  std::string RequestLog() const;
  // Byte i of every object fault_server.py serves (version 1).
  static char Byte(size_t i) { return static_cast<char>((i * 131 + 7) % 251); }

 private:
  shardcache::testing::TempDir dir_;
  int port_ = 0;
  std::unique_ptr<shardcache::testing::Process> proc_;
};

// Fails the current test naming `program` and `make setup` when it is not on PATH.
void RequireProgram(const std::string& program);

// A client of `uri` with options `o`; fails the current test (with the status) when it cannot open.
std::unique_ptr<ObjectClient> OpenClient(const std::string& uri, const ObjectStoreOptions& o);

}  // namespace shardcache::objstore::testing
