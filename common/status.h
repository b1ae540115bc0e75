#pragma once

#include <optional>
#include <string>
#include <utility>
#include <variant>

#include <fmt/format.h>

namespace loom {

// The codes are gRPC's, chosen by what the caller should do next: fix the input
// (InvalidArgument), change a state first (FailedPrecondition), retry (Unavailable), ...
enum class StatusCode {
  kOk = 0,
  kCancelled = 1,
  kUnknown = 2,
  kInvalidArgument = 3,
  kDeadlineExceeded = 4,
  kNotFound = 5,
  kAlreadyExists = 6,
  kPermissionDenied = 7,
  kResourceExhausted = 8,
  kFailedPrecondition = 9,
  kAborted = 10,
  kOutOfRange = 11,
  kUnimplemented = 12,
  kInternal = 13,
  kUnavailable = 14,
  kDataLoss = 15,
  kUnauthenticated = 16,
};

const char* statusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status ok() { return {}; }

  bool isOk() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }

  // "context: message", so errors read outermost-first: "rank 3: loading shard 7: ...".
  Status withContext(const std::string& context) const {
    if (isOk()) return *this;
    return {code_, context + ": " + message_};
  }
  std::string toString() const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

template <typename... Args>
Status invalidArgument(fmt::format_string<Args...> f, Args&&... args) {
  return {StatusCode::kInvalidArgument, fmt::format(f, std::forward<Args>(args)...)};
}
template <typename... Args>
Status notFound(fmt::format_string<Args...> f, Args&&... args) {
  return {StatusCode::kNotFound, fmt::format(f, std::forward<Args>(args)...)};
}
template <typename... Args>
Status failedPrecondition(fmt::format_string<Args...> f, Args&&... args) {
  return {StatusCode::kFailedPrecondition, fmt::format(f, std::forward<Args>(args)...)};
}
template <typename... Args>
Status unavailable(fmt::format_string<Args...> f, Args&&... args) {
  return {StatusCode::kUnavailable, fmt::format(f, std::forward<Args>(args)...)};
}
template <typename... Args>
Status internalError(fmt::format_string<Args...> f, Args&&... args) {
  return {StatusCode::kInternal, fmt::format(f, std::forward<Args>(args)...)};
}
// An OS call failed: the message carries strerror(errno).
Status errnoStatus(const std::string& what);

template <typename T>
class [[nodiscard]] StatusOr {
 public:
  StatusOr(T value) : value_(std::move(value)) {}
  StatusOr(Status status) : status_(std::move(status)) {}

  bool isOk() const { return status_.isOk(); }
  const Status& status() const { return status_; }
  T& value() & { return *value_; }
  const T& value() const& { return *value_; }
  T&& value() && { return std::move(*value_); }
  T* operator->() { return &*value_; }
  const T* operator->() const { return &*value_; }
  T& operator*() { return *value_; }
  const T& operator*() const { return *value_; }

 private:
  Status status_;
  std::optional<T> value_;
};

}  // namespace loom

#define LOOM_CONCAT_INNER(a, b) a##b
#define LOOM_CONCAT(a, b) LOOM_CONCAT_INNER(a, b)

#define RETURN_IF_ERROR(expr)                  \
  do {                                         \
    ::loom::Status loom_status_ = (expr);      \
    if (!loom_status_.isOk()) return loom_status_; \
  } while (0)

#define ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                          \
  if (!tmp.isOk()) return tmp.status();       \
  lhs = std::move(tmp).value()

#define ASSIGN_OR_RETURN(lhs, expr) \
  ASSIGN_OR_RETURN_IMPL(LOOM_CONCAT(loom_statusor_, __LINE__), lhs, expr)
