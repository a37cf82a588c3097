#include "objstore/options.h"

#include <stdlib.h>

#include <catch2/catch.hpp>
#include <fstream>

#include "objstore/errors.h"
#include "objstore/s3_xml.h"
#include "testing/temp_dir.h"

namespace shardcache::objstore {
namespace {

// Sets (or unsets, for nullptr) an environment variable for one scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    const char* old = ::getenv(name);
    had_ = old != nullptr;
    if (had_) old_ = old;
    if (value) ::setenv(name, value, 1); else ::unsetenv(name);
  }
  ~ScopedEnv() {
    if (had_) ::setenv(name_, old_.c_str(), 1); else ::unsetenv(name_);
  }

 private:
  const char* name_;
  bool had_ = false;
  std::string old_;
};

TEST_CASE("credentials come from config, then the environment, then the credentials file", "[objstore]") {
  shardcache::testing::TempDir dir;
  std::ofstream(dir / "credentials") << "[default]\naws_access_key_id = FILEKEY\naws_secret_access_key = filesecret\n"
                                     << "[other]\naws_access_key_id=OTHERKEY\naws_secret_access_key=othersecret\n"
                                     << "aws_session_token = othertoken\n";
  ScopedEnv id("AWS_ACCESS_KEY_ID", "ENVKEY"), secret("AWS_SECRET_ACCESS_KEY", "envsecret"),
      token("AWS_SESSION_TOKEN", nullptr), profile("AWS_PROFILE", nullptr), file("AWS_SHARED_CREDENTIALS_FILE", nullptr);
  ObjectStoreOptions o;
  o.credentials_file = dir / "credentials";
  o.credentials.access_key_id = "CONFKEY";
  o.credentials.secret_access_key = "confsecret";
  CHECK(ResolveCredentials(o)->access_key_id == "CONFKEY");
  o.credentials = {};
  CHECK(ResolveCredentials(o)->access_key_id == "ENVKEY");
  CHECK(ResolveCredentials(o)->source == "environment");
  ::unsetenv("AWS_ACCESS_KEY_ID");
  ::unsetenv("AWS_SECRET_ACCESS_KEY");
  CHECK(ResolveCredentials(o)->secret_access_key == "filesecret");
  o.profile = "other";
  auto other = ResolveCredentials(o);
  REQUIRE(other.ok());
  CHECK(other->access_key_id == "OTHERKEY");
  CHECK(other->session_token == "othertoken");
  o.profile = "missing";
  CHECK_THAT(ResolveCredentials(o).status().message(), Catch::Contains("no profile [missing]"));
}

TEST_CASE("no credentials anywhere means unsigned requests; half a key pair is refused", "[objstore]") {
  shardcache::testing::TempDir dir;
  ScopedEnv id("AWS_ACCESS_KEY_ID", nullptr), secret("AWS_SECRET_ACCESS_KEY", nullptr), home("HOME", dir.path().c_str()),
      file("AWS_SHARED_CREDENTIALS_FILE", nullptr), profile("AWS_PROFILE", nullptr);
  ObjectStoreOptions o;
  auto none = ResolveCredentials(o);
  REQUIRE(none.ok());
  CHECK(none->empty());
  ::setenv("AWS_ACCESS_KEY_ID", "ONLYKEY", 1);
  CHECK_THAT(ResolveCredentials(o).status().message(), Catch::Contains("no secret access key"));
}

TEST_CASE("option and credential strings never carry the secret or the session token", "[objstore]") {
  ObjectStoreOptions o;
  o.endpoint = "http://127.0.0.1:4568";
  o.credentials = {"AKIAEXAMPLE", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", "SESSIONTOKEN123", "config"};
  const std::string s = o.ToString();
  CHECK_THAT(s, Catch::Contains("AKIAEXAMPLE"));
  CHECK_THAT(s, Catch::Contains("redacted"));
  CHECK_THAT(s, !Catch::Contains("wJalrXUtnFEMI"));
  CHECK_THAT(s, !Catch::Contains("SESSIONTOKEN123"));
  CHECK_THAT(o.credentials.ToString(), !Catch::Contains("wJalrXUtnFEMI"));
}

TEST_CASE("endpoint and region default to the AWS CLI's environment variables", "[objstore]") {
  ScopedEnv s3("AWS_ENDPOINT_URL_S3", nullptr), any("AWS_ENDPOINT_URL", "http://minio:9000"),
      region("AWS_REGION", nullptr), def("AWS_DEFAULT_REGION", "eu-west-3");
  ObjectStoreOptions o = WithEnvironmentDefaults(ObjectStoreOptions{});
  CHECK(o.endpoint == "http://minio:9000");
  CHECK(o.region == "eu-west-3");
  ::setenv("AWS_ENDPOINT_URL_S3", "https://s3.internal", 1);
  ::setenv("AWS_REGION", "ap-south-1", 1);
  o = WithEnvironmentDefaults(ObjectStoreOptions{});
  CHECK(o.endpoint == "https://s3.internal");
  CHECK(o.region == "ap-south-1");
  ObjectStoreOptions given;
  given.endpoint = "http://127.0.0.1:1";
  given.region = "us-west-2";
  o = WithEnvironmentDefaults(given);
  CHECK(o.endpoint == "http://127.0.0.1:1");
  CHECK(o.region == "us-west-2");
  ::unsetenv("AWS_REGION");
  ::unsetenv("AWS_DEFAULT_REGION");
  CHECK(WithEnvironmentDefaults(ObjectStoreOptions{}).region == "us-east-1");
}

TEST_CASE("options are validated naming the field", "[objstore]") {
  ObjectStoreOptions o;
  CHECK(o.Validate().ok());
  o.endpoint = "s3.example.com";
  CHECK_THAT(o.Validate().message(), Catch::Contains("endpoint"));
  o.endpoint = "";
  o.addressing = "dns";
  CHECK_THAT(o.Validate().message(), Catch::Contains("addressing"));
  o.addressing = "path";
  o.max_connections = 0;
  CHECK_THAT(o.Validate().message(), Catch::Contains("max_connections"));
}

TEST_CASE("S3 error bodies and list pages are read with entities decoded", "[objstore]") {
  const S3Error e = ParseS3Error(
      "<?xml version=\"1.0\"?><Error><Code>NoSuchBucket</Code><Message>a &amp; b &lt;c&gt;</Message></Error>");
  CHECK(e.code == "NoSuchBucket");
  CHECK(e.message == "a & b <c>");
  ListPage page;
  REQUIRE(ParseListPage("<ListBucketResult><IsTruncated>true</IsTruncated><Contents><Key>a/x&#38;y</Key>"
                        "<ETag>&quot;abc&quot;</ETag><Size>12</Size></Contents><Contents><Key>a/z</Key><Size>0</Size>"
                        "</Contents><NextContinuationToken>tok/1=</NextContinuationToken></ListBucketResult>",
                        &page));
  REQUIRE(page.objects.size() == 2);
  CHECK(page.objects[0].key == "a/x&y");
  CHECK(page.objects[0].etag == "\"abc\"");
  CHECK(page.objects[0].size == 12);
  CHECK(page.truncated);
  CHECK(page.next_token == "tok/1=");
  CHECK_FALSE(ParseListPage("<Error><Code>x</Code></Error>", &page));
}

TEST_CASE("HTTP failures become named errors; only throttling and 5xx are retryable", "[objstore]") {
  ErrorContext ctx{"http://h:1", "bkt", "s3://bkt/k", "AKID"};
  CHECK(HttpError(ctx, 404, "<Error><Code>NoSuchBucket</Code></Error>").message() ==
        "bucket bkt does not exist at http://h:1 (HTTP 404 NoSuchBucket)");
  CHECK(HttpError(ctx, 404, "").code() == StatusCode::kNotFound);
  const Status denied = HttpError(ctx, 403, "<Error><Code>SignatureDoesNotMatch</Code></Error>");
  CHECK(denied.code() == StatusCode::kPermissionDenied);
  CHECK_THAT(denied.message(), Catch::StartsWith("credentials refused by http://h:1 for bucket bkt"));
  CHECK(HttpError(ctx, 412, "").code() == StatusCode::kFailedPrecondition);
  CHECK(HttpError(ctx, 503, "<Error><Code>SlowDown</Code></Error>").code() == StatusCode::kUnavailable);
  CHECK(RetryableHttp(503, "SlowDown"));
  CHECK(RetryableHttp(429, ""));
  CHECK(RetryableHttp(500, ""));
  CHECK_FALSE(RetryableHttp(403, "AccessDenied"));
  CHECK_FALSE(RetryableHttp(404, ""));
}

}  // namespace
}  // namespace shardcache::objstore
