// ObjectStoreOptions: how ObjectClient reaches an object store — endpoint, region, addressing,
// credentials, TLS, timeouts, connection cap and retry policy — and where credentials come from.
//
// Credentials are looked up in this order (ResolveCredentials): the options themselves (config),
// then the environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN), then a
// credentials file in the AWS CLI's INI format (`credentials_file`, else
// $AWS_SHARED_CREDENTIALS_FILE, else ~/.aws/credentials; profile `profile`, else $AWS_PROFILE,
// else "default"). None found: requests go unsigned (public buckets, plain https://).
//
// Secrets never reach a log line or a message: ToString() redacts the secret and the session
// token, and error messages name only the access key id (not secret; S3 itself echoes it).
//
// Thread safety: plain values and pure functions (ResolveCredentials reads the environment and
// a file).
#pragma once

#include <cstdint>
#include <string>

#include "common/status.h"

namespace shardcache::objstore {

struct Credentials {
  std::string access_key_id;
  std::string secret_access_key;
  std::string session_token;  // optional (temporary credentials); sent as x-amz-security-token
  std::string source;         // where they came from: "config", "environment", "FILE [profile]"

  bool empty() const { return access_key_id.empty(); }
  // "access key id AKIA... (secret redacted, session token redacted|none) from SOURCE".
  std::string ToString() const;
  bool operator==(const Credentials&) const = default;
};

struct ObjectStoreOptions {
  // S3 endpoint: "http(s)://host[:port]". Default: "" = $AWS_ENDPOINT_URL_S3, else
  // $AWS_ENDPOINT_URL (the AWS CLI's variables), else https://s3.REGION.amazonaws.com.
  // Ignored for http(s):// object URIs, which name their own host.
  std::string endpoint;
  // Region the requests are signed for. Default: "" = $AWS_REGION, else $AWS_DEFAULT_REGION,
  // else "us-east-1".
  std::string region;
  // "auto": virtual-host style (https://BUCKET.host/KEY) for *.amazonaws.com endpoints, path
  // style (https://host/BUCKET/KEY) for any other (MinIO, Ceph RGW, loopback); "path";
  // "virtual". Default: "auto".
  std::string addressing = "auto";
  // Config credentials; empty access_key_id = look further (environment, file).
  Credentials credentials;
  // Credentials file and profile (see above). Default: "" = the AWS CLI's defaults.
  std::string credentials_file;
  std::string profile;
  // TLS: a CA bundle (PEM) to verify servers with; "" = the system's. verify_tls = false turns
  // verification off (tests only; logged as a warning). Default: "", true.
  std::string ca_file;
  bool verify_tls = true;
  // One HTTP request (connect to last byte), and how long a connection may stall with no byte
  // arriving before it counts as dropped (then retried, resuming). Default: 60000 ms, 15000 ms.
  uint32_t request_timeout_ms = 60000;
  uint32_t stall_timeout_ms = 15000;
  uint32_t connect_timeout_ms = 10000;
  // Most connections (and so requests) open at once to the store. Default: 256 (like the gRPC
  // pool's cap: a chunk is read as 1 MiB parts on their own connections, and a long link with a
  // small window needs many busy at once).
  uint32_t max_connections = 256;
  // Retries of throttled (503 SlowDown, 429), failed (5xx) and dropped requests: attempts in all,
  // and the exponential backoff's first and largest delay (full jitter). Default: 6, 100, 5000.
  uint32_t max_attempts = 6;
  uint32_t backoff_initial_ms = 100;
  uint32_t backoff_max_ms = 5000;
  // Keys per ListObjectsV2 page (max-keys; S3 returns at most 1000). Default: 1000.
  uint32_t list_page_keys = 1000;

  // Names every field, secrets redacted.
  std::string ToString() const;
  bool operator==(const ObjectStoreOptions&) const = default;
  // InvalidArgument naming the field: bad endpoint scheme, addressing, zero connections/attempts.
  Status Validate() const;
};

// `options` with the environment's endpoint and region filled in where they are empty (above).
ObjectStoreOptions WithEnvironmentDefaults(ObjectStoreOptions options);

// The credentials to sign with (see the header comment), or an empty Credentials when none are
// configured anywhere. InvalidArgument when the file's profile lacks a key or a secret, or the
// config / environment gives a key id without a secret.
Result<Credentials> ResolveCredentials(const ObjectStoreOptions& options);

}  // namespace shardcache::objstore
