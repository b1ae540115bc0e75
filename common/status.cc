#include "common/status.h"

#include <cerrno>
#include <cstring>

namespace loom {

const char* statusCodeName(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return "OK";
    case StatusCode::kCancelled: return "CANCELLED";
    case StatusCode::kUnknown: return "UNKNOWN";
    case StatusCode::kInvalidArgument: return "INVALID_ARGUMENT";
    case StatusCode::kDeadlineExceeded: return "DEADLINE_EXCEEDED";
    case StatusCode::kNotFound: return "NOT_FOUND";
    case StatusCode::kAlreadyExists: return "ALREADY_EXISTS";
    case StatusCode::kPermissionDenied: return "PERMISSION_DENIED";
    case StatusCode::kResourceExhausted: return "RESOURCE_EXHAUSTED";
    case StatusCode::kFailedPrecondition: return "FAILED_PRECONDITION";
    case StatusCode::kAborted: return "ABORTED";
    case StatusCode::kOutOfRange: return "OUT_OF_RANGE";
    case StatusCode::kUnimplemented: return "UNIMPLEMENTED";
    case StatusCode::kInternal: return "INTERNAL";
    case StatusCode::kUnavailable: return "UNAVAILABLE";
    case StatusCode::kDataLoss: return "DATA_LOSS";
    case StatusCode::kUnauthenticated: return "UNAUTHENTICATED";
  }
  return "UNKNOWN";
}

std::string Status::toString() const {
  if (isOk()) return "OK";
  return std::string(statusCodeName(code_)) + ": " + message_;
}

Status errnoStatus(const std::string& what) {
  const int err = errno;
  // The code says what the caller can do about it: NotFound, PermissionDenied, ResourceExhausted
  // for a full disk, AlreadyExists; Internal for the rest.
  StatusCode code = StatusCode::kInternal;
  switch (err) {
    case ENOENT: case ENOTDIR: code = StatusCode::kNotFound; break;
    case EACCES: case EPERM: case EROFS: code = StatusCode::kPermissionDenied; break;
    case ENOSPC: case EDQUOT: case EFBIG: code = StatusCode::kResourceExhausted; break;
    case EEXIST: code = StatusCode::kAlreadyExists; break;
    default: break;
  }
  return {code, what + ": " + std::strerror(err)};
}

}  // namespace loom
