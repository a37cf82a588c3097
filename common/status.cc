#include "common/status.h"

#include <cerrno>
#include <cstring>

namespace shardcache {

const char* StatusCodeName(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return "OK";
    case StatusCode::kCancelled: return "Cancelled";
    case StatusCode::kUnknown: return "Unknown";
    case StatusCode::kInvalidArgument: return "InvalidArgument";
    case StatusCode::kDeadlineExceeded: return "DeadlineExceeded";
    case StatusCode::kNotFound: return "NotFound";
    case StatusCode::kAlreadyExists: return "AlreadyExists";
    case StatusCode::kPermissionDenied: return "PermissionDenied";
    case StatusCode::kResourceExhausted: return "ResourceExhausted";
    case StatusCode::kFailedPrecondition: return "FailedPrecondition";
    case StatusCode::kAborted: return "Aborted";
    case StatusCode::kOutOfRange: return "OutOfRange";
    case StatusCode::kUnimplemented: return "Unimplemented";
    case StatusCode::kInternal: return "Internal";
    case StatusCode::kUnavailable: return "Unavailable";
    case StatusCode::kDataLoss: return "DataLoss";
    case StatusCode::kUnauthenticated: return "Unauthenticated";
  }
  return "Unknown";
}

std::string Status::ToString() const {
  if (ok()) return "OK";
  return std::string(StatusCodeName(code_)) + ": " + message_;
}

bool Status::IsRetryable() const {
  return code_ == StatusCode::kUnavailable || code_ == StatusCode::kDeadlineExceeded ||
         code_ == StatusCode::kResourceExhausted || code_ == StatusCode::kAborted;
}

Status Status::WithContext(const std::string& context) const {
  if (ok()) return *this;
  return Status(code_, context + ": " + message_);
}

Status ErrnoStatus(int err, const std::string& what) {
  std::string m = what + ": " + std::strerror(err);
  switch (err) {
    case ENOENT: return NotFound(m);
    case ENOSPC:
    case EDQUOT:
    case ENOMEM: return ResourceExhausted(m);
    case EACCES:
    case EPERM: return PermissionDenied(m);
    case EINTR:
    case EAGAIN:
    case ECONNREFUSED:
    case ECONNRESET:
    case EPIPE: return Unavailable(m);
    case EINVAL: return InvalidArgument(m);
    case EIO: return DataLoss(m);
    default: return Internal(m);
  }
}

}  // namespace shardcache
