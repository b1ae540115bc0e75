#pragma once

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

namespace loom::testing {

// A TCP port that was free a moment ago (for programs that take a port number rather than
// binding port 0 themselves).
inline int freePort() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  socklen_t len = sizeof addr;
  ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(fd);
  return ntohs(addr.sin_port);
}

}  // namespace loom::testing
