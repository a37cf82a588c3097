#include "objstore/errors.h"

#include "objstore/s3_xml.h"

namespace shardcache::objstore {
namespace {

std::string Where(const ErrorContext& ctx) { return ctx.object.empty() ? "bucket " + ctx.bucket : ctx.object; }

std::string S3Text(long http_code, const S3Error& e) {
  std::string t = "HTTP " + std::to_string(http_code);
  if (!e.code.empty()) t += " " + e.code;
  if (!e.message.empty()) t += ": " + e.message;
  return t;
}

Status CredentialsRefused(const ErrorContext& ctx, long http_code, const S3Error& e) {
  std::string what = ctx.bucket.empty() ? ctx.object : "bucket " + ctx.bucket;
  std::string msg = "credentials refused by " + ctx.endpoint + " for " + what + " (" + S3Text(http_code, e);
  if (ctx.access_key_id.empty()) {
    msg += "; the request was unsigned: no credentials in config, AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY "
           "or the credentials file)";
  } else {
    msg += "; access key id " + ctx.access_key_id +
           ": check the access key id, secret access key and region in config, the environment or the "
           "credentials file, and the bucket's policy)";
  }
  return PermissionDenied(msg);
}

}  // namespace

bool RetryableHttp(long http_code, const std::string& s3_code) {
  if (http_code >= 500 || http_code == 429) return true;
  return s3_code == "SlowDown" || s3_code == "InternalError" || s3_code == "RequestTimeout" ||
         s3_code == "ServiceUnavailable";
}

Status ObjectChanged(const std::string& object, const std::string& expected_etag, const std::string& found_etag,
                     uint64_t expected_size, uint64_t found_size) {
  auto or_unknown = [](const std::string& s) { return s.empty() ? std::string("?") : s; };
  std::string what = "ETag " + or_unknown(expected_etag) + " -> " + or_unknown(found_etag);
  if (expected_size != found_size) {
    what += ", size " + std::to_string(expected_size) + " -> " + std::to_string(found_size);
  }
  return FailedPrecondition("object " + object + " changed since it was indexed (" + what +
                            "); re-run shardctl index");
}

Status HttpError(const ErrorContext& ctx, long http_code, const std::string& body) {
  const S3Error e = ParseS3Error(body);
  const std::string text = S3Text(http_code, e);
  if (e.code == "NoSuchBucket") {
    return NotFound("bucket " + ctx.bucket + " does not exist at " + ctx.endpoint + " (" + text + ")");
  }
  if (e.code == "NoSuchKey" || (http_code == 404 && e.code.empty())) {
    return NotFound("object " + Where(ctx) + " does not exist at " + ctx.endpoint + " (" + text + ")");
  }
  if (e.code == "InvalidAccessKeyId" || e.code == "SignatureDoesNotMatch" || e.code == "AccessDenied" ||
      e.code == "ExpiredToken" || e.code == "InvalidToken" || http_code == 401 || http_code == 403) {
    return CredentialsRefused(ctx, http_code, e);
  }
  if (http_code == 412 || e.code == "PreconditionFailed") return ObjectChanged(Where(ctx), "", "", 0, 0);
  if (http_code == 416 || e.code == "InvalidRange") {
    return OutOfRange("range past the end of object " + Where(ctx) + " at " + ctx.endpoint + " (" + text + ")");
  }
  if (RetryableHttp(http_code, e.code)) {
    return Unavailable(ctx.endpoint + " answered " + text + " for " + Where(ctx));
  }
  if (http_code == 400 && (e.code == "AuthorizationHeaderMalformed" || e.code == "PermanentRedirect")) {
    return InvalidArgument(ctx.endpoint + " refused the request for " + Where(ctx) + " (" + text +
                           "): check the region and endpoint");
  }
  // Any other refusal means a request this client should not have sent, or a store that speaks
  // another dialect: neither is the operator's input nor worth retrying.
  return Internal(ctx.endpoint + " refused the request for " + Where(ctx) + " (" + text + ")");
}

}  // namespace shardcache::objstore
