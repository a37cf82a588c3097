#include "tools/shardctl/objstore_flags.h"

namespace shardcache::shardctl {

void ObjectStoreFlags::AddTo(CLI::App* sub) {
  sub->add_option("--endpoint", endpoint,
                  "s3://: endpoint http(s)://HOST[:PORT] (default: $AWS_ENDPOINT_URL_S3, $AWS_ENDPOINT_URL, "
                  "else AWS for the region)");
  sub->add_option("--region", region, "s3://: region to sign for (default: $AWS_REGION, $AWS_DEFAULT_REGION, us-east-1)");
  sub->add_option("--addressing", addressing, "s3://: auto | path | virtual")->capture_default_str();
  sub->add_option("--credentials-file", credentials_file,
                  "s3://: AWS CLI credentials file (default: $AWS_SHARED_CREDENTIALS_FILE, ~/.aws/credentials); "
                  "$AWS_ACCESS_KEY_ID/$AWS_SECRET_ACCESS_KEY come first");
  sub->add_option("--profile", profile, "s3://: profile in the credentials file (default: $AWS_PROFILE, default)");
  sub->add_option("--objstore-ca", ca_file, "s3:// and https://: PEM CA bundle to verify the store with (default: the system's)");
}

Result<objstore::ObjectStoreOptions> ObjectStoreFlags::Options() const {
  objstore::ObjectStoreOptions o;
  o.endpoint = endpoint;
  o.region = region;
  o.addressing = addressing;
  o.credentials_file = credentials_file;
  o.profile = profile;
  o.ca_file = ca_file;
  SC_RETURN_IF_ERROR(o.Validate());
  return o;
}

Result<std::unique_ptr<objstore::ObjectClient>> ObjectStoreFlags::Open(const std::string& uri) const {
  SC_ASSIGN_OR_RETURN(objstore::ObjectUri parsed, objstore::ParseObjectUri(uri));
  SC_ASSIGN_OR_RETURN(objstore::ObjectStoreOptions o, Options());
  return objstore::ObjectClient::Open(parsed, o);
}

bool IsObjectUri(const std::string& arg) {
  for (const char* scheme : {"s3://", "https://", "http://"}) {
    if (arg.rfind(scheme, 0) == 0) return true;
  }
  return false;
}

}  // namespace shardcache::shardctl
