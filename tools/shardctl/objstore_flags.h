// Object-store flags shared by every shardctl command that reads or writes a bucket (index,
// pack, warm): the CLI twins of the daemon config's [objstore] keys that say where the store is
// and who is asking. Unset flags fall back exactly as the daemon does (objstore/options.h):
// endpoint and region from AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL / AWS_REGION /
// AWS_DEFAULT_REGION, credentials from AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY /
// AWS_SESSION_TOKEN, else the credentials file's profile. No flag takes a secret: a command
// line is visible to every user of the machine.
//
// Thread safety: plain values, used on the main thread.
#pragma once

#include <memory>
#include <string>

#include <CLI/CLI.hpp>

#include "common/status.h"
#include "objstore/object_client.h"
#include "objstore/options.h"

namespace shardcache::shardctl {

struct ObjectStoreFlags {
  std::string endpoint, region, addressing = "auto", credentials_file, profile, ca_file;

  // Adds --endpoint, --region, --addressing, --credentials-file, --profile and --objstore-ca
  // (not --ca: warm's --ca is the CA of a grpcs:// upstream) to `sub`.
  void AddTo(CLI::App* sub);
  // The options these flags give (validated: InvalidArgument naming the flag's key).
  Result<objstore::ObjectStoreOptions> Options() const;
  // A client of `uri` (ParseObjectUri's syntax) with Options(); InvalidArgument for a bad URI
  // or options.
  Result<std::unique_ptr<objstore::ObjectClient>> Open(const std::string& uri) const;
};

// True when `arg` names an object store location (s3://, https://, http://) rather than a path.
bool IsObjectUri(const std::string& arg);

}  // namespace shardcache::shardctl
