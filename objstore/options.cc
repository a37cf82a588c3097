#include "objstore/options.h"

#include <cstdlib>
#include <fstream>

namespace shardcache::objstore {
namespace {

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

std::string Trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return "";
  const size_t e = s.find_last_not_of(" \t\r\n");
  return s.substr(b, e - b + 1);
}

Status CheckPair(const Credentials& c, const std::string& where) {
  if (!c.access_key_id.empty() && c.secret_access_key.empty()) {
    return InvalidArgument(where + " gives access key id " + c.access_key_id + " but no secret access key");
  }
  if (c.access_key_id.empty() && !c.secret_access_key.empty()) {
    return InvalidArgument(where + " gives a secret access key but no access key id");
  }
  return Status::Ok();
}

// Reads [profile] of an AWS CLI credentials file; NotFound when the file or profile is absent.
Result<Credentials> ReadCredentialsFile(const std::string& path, const std::string& profile) {
  std::ifstream in(path);
  if (!in) return NotFound("no credentials file " + path);
  Credentials c;
  c.source = path + " [" + profile + "]";
  bool in_profile = false, seen = false;
  std::string line;
  while (std::getline(in, line)) {
    line = Trim(line);
    if (line.empty() || line[0] == '#' || line[0] == ';') continue;
    if (line.front() == '[' && line.back() == ']') {
      in_profile = Trim(line.substr(1, line.size() - 2)) == profile;
      seen = seen || in_profile;
      continue;
    }
    const size_t eq = line.find('=');
    if (!in_profile || eq == std::string::npos) continue;
    const std::string key = Trim(line.substr(0, eq)), value = Trim(line.substr(eq + 1));
    if (key == "aws_access_key_id") c.access_key_id = value;
    if (key == "aws_secret_access_key") c.secret_access_key = value;
    if (key == "aws_session_token") c.session_token = value;
  }
  if (!seen) return NotFound("no profile [" + profile + "] in " + path);
  if (c.access_key_id.empty() || c.secret_access_key.empty()) {
    return InvalidArgument("profile [" + profile + "] of " + path +
                           " needs both aws_access_key_id and aws_secret_access_key");
  }
  return c;
}

}  // namespace

std::string Credentials::ToString() const {
  if (empty()) return "no credentials (unsigned requests)";
  return "access key id " + access_key_id + " (secret redacted, session token " +
         (session_token.empty() ? "none" : "redacted") + ") from " + source;
}

std::string ObjectStoreOptions::ToString() const {
  return "endpoint=" + (endpoint.empty() ? "(aws default)" : endpoint) + " region=" + (region.empty() ? "(environment or us-east-1)" : region) +
         " addressing=" + addressing + " credentials=" +
         (credentials.empty() ? "(from environment or file)"
                              : "access key id " + credentials.access_key_id + " (secret redacted) from config") +
         " ca_file=" + (ca_file.empty() ? "(system)" : ca_file) + " verify_tls=" + (verify_tls ? "true" : "false") +
         " request_timeout_ms=" + std::to_string(request_timeout_ms) +
         " stall_timeout_ms=" + std::to_string(stall_timeout_ms) +
         " max_connections=" + std::to_string(max_connections) + " max_attempts=" + std::to_string(max_attempts);
}

Status ObjectStoreOptions::Validate() const {
  if (!endpoint.empty() && endpoint.rfind("http://", 0) != 0 && endpoint.rfind("https://", 0) != 0) {
    return InvalidArgument("endpoint '" + endpoint + "' must start with http:// or https://");
  }
  if (addressing != "auto" && addressing != "path" && addressing != "virtual") {
    return InvalidArgument("addressing '" + addressing + "' must be auto, path or virtual");
  }
  if (max_connections == 0) return InvalidArgument("max_connections must be at least 1");
  if (max_attempts == 0) return InvalidArgument("max_attempts must be at least 1");
  if (list_page_keys == 0 || list_page_keys > 1000) return InvalidArgument("list_page_keys must be 1 to 1000");
  return CheckPair(credentials, "config");
}

ObjectStoreOptions WithEnvironmentDefaults(ObjectStoreOptions o) {
  for (const char* name : {"AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"}) {
    if (o.endpoint.empty()) o.endpoint = Env(name);
  }
  for (const char* name : {"AWS_REGION", "AWS_DEFAULT_REGION"}) {
    if (o.region.empty()) o.region = Env(name);
  }
  if (o.region.empty()) o.region = "us-east-1";
  return o;
}

Result<Credentials> ResolveCredentials(const ObjectStoreOptions& options) {
  if (!options.credentials.empty() || !options.credentials.secret_access_key.empty()) {
    SC_RETURN_IF_ERROR(CheckPair(options.credentials, "config"));
    Credentials c = options.credentials;
    c.source = "config";
    return c;
  }
  Credentials env{Env("AWS_ACCESS_KEY_ID"), Env("AWS_SECRET_ACCESS_KEY"), Env("AWS_SESSION_TOKEN"), "environment"};
  SC_RETURN_IF_ERROR(CheckPair(env, "the environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY)"));
  if (!env.empty()) return env;
  std::string path = options.credentials_file;
  if (path.empty()) path = Env("AWS_SHARED_CREDENTIALS_FILE");
  if (path.empty() && !Env("HOME").empty()) path = Env("HOME") + "/.aws/credentials";
  std::string profile = options.profile.empty() ? Env("AWS_PROFILE") : options.profile;
  if (profile.empty()) profile = "default";
  Result<Credentials> file = ReadCredentialsFile(path, profile);
  if (file.ok()) return file;
  // An explicitly named file or profile that is missing is an error; the defaults may be absent.
  if (file.status().code() != StatusCode::kNotFound ||
      !options.credentials_file.empty() || !options.profile.empty()) {
    return file.status();
  }
  return Credentials{};
}

}  // namespace shardcache::objstore
