#include "daemon/report_socket.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>

#include <spdlog/spdlog.h>

namespace loom::daemon {

StatusOr<std::unique_ptr<ReportSocket>> ReportSocket::open(const std::string& path, Handler handler) {
  sockaddr_un addr{};
  if (path.size() >= sizeof(addr.sun_path))
    return invalidArgument("report socket path {} is longer than {} bytes: use a shorter --state-dir", path,
                           sizeof(addr.sun_path) - 1);
  int fd = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return errnoStatus("socket");
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  ::unlink(path.c_str());  // left by a daemon that did not stop cleanly
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    Status s = errnoStatus("bind " + path);
    ::close(fd);
    return s;
  }
  // Many ranks, bursts of reports: a deeper receive queue than the default.
  int size = 4 << 20;
  ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &size, sizeof size);
  return std::unique_ptr<ReportSocket>(new ReportSocket(path, fd, std::move(handler)));
}

ReportSocket::ReportSocket(std::string path, int fd, Handler handler)
    : path_(std::move(path)), fd_(fd), wakeFd_(::eventfd(0, EFD_CLOEXEC)),
      flushFd_(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)), handler_(std::move(handler)) {
  thread_ = std::thread([this] { run(); });
}

ReportSocket::~ReportSocket() {
  uint64_t one = 1;
  (void)!::write(wakeFd_, &one, sizeof one);
  if (thread_.joinable()) thread_.join();
  ::close(fd_);
  ::close(wakeFd_);
  ::close(flushFd_);
  ::unlink(path_.c_str());
}

void ReportSocket::afterQueued(std::function<void()> fn) {
  {
    std::lock_guard lock(mu_);
    afterQueued_.push_back(std::move(fn));
  }
  uint64_t one = 1;
  (void)!::write(flushFd_, &one, sizeof one);
}

void ReportSocket::handle(const std::string& buffer, ssize_t n) {
  auto message = WorkerMessage::decode(buffer.substr(0, static_cast<size_t>(n)));
  if (!message.isOk()) {
    spdlog::warn("report socket: dropped a malformed datagram: {}", message.status().message());
    return;
  }
  handler_(std::move(message).value());
}

void ReportSocket::handleQueued(std::string& buffer) {
  for (;;) {
    ssize_t n = ::recv(fd_, buffer.data(), buffer.size(), MSG_DONTWAIT);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    handle(buffer, n);
  }
}

void ReportSocket::run() {
  std::string buffer(64 * 1024, '\0');
  for (;;) {
    pollfd fds[3] = {{fd_, POLLIN, 0}, {wakeFd_, POLLIN, 0}, {flushFd_, POLLIN, 0}};
    if (::poll(fds, 3, -1) < 0) {
      if (errno == EINTR) continue;
      spdlog::error("report socket: poll: {}", std::strerror(errno));
      return;
    }
    if (fds[1].revents) return;
    if (fds[2].revents) {
      uint64_t count;
      (void)!::read(flushFd_, &count, sizeof count);
      std::vector<std::function<void()>> due;
      {
        std::lock_guard lock(mu_);
        due.swap(afterQueued_);
      }
      handleQueued(buffer);
      for (auto& fn : due) fn();
      continue;
    }
    ssize_t n = ::recv(fd_, buffer.data(), buffer.size(), 0);
    if (n <= 0) continue;
    handle(buffer, n);
  }
}

}  // namespace loom::daemon
