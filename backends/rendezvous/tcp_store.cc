#include "backends/rendezvous/tcp_store.h"

#include <algorithm>
#include <charconv>
#include <cstring>
#include <thread>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fmt/format.h>

namespace loom::backends {

// Wire format: every message is a 4-byte little-endian length and a payload. Requests:
// 'S' key value | 'G' key... (answers the values of the keys present, "" for absent ones, each
// with a presence byte) | 'A' key delta. Strings inside a payload are length-prefixed too.
namespace {

void putString(std::string& out, const std::string& s) {
  uint32_t n = static_cast<uint32_t>(s.size());
  out.append(reinterpret_cast<const char*>(&n), 4);
  out += s;
}

bool takeString(const std::string& in, size_t& pos, std::string* s) {
  if (pos + 4 > in.size()) return false;
  uint32_t n;
  std::memcpy(&n, in.data() + pos, 4);
  pos += 4;
  if (pos + n > in.size()) return false;
  *s = in.substr(pos, n);
  pos += n;
  return true;
}

bool writeAll(int fd, const char* data, size_t size) {
  while (size > 0) {
    ssize_t n = ::send(fd, data, size, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    data += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

bool sendMessage(int fd, const std::string& payload) {
  std::string framed;
  uint32_t n = static_cast<uint32_t>(payload.size());
  framed.append(reinterpret_cast<const char*>(&n), 4);
  framed += payload;
  return writeAll(fd, framed.data(), framed.size());
}

// Reads one framed message, waiting at most `timeout` for it to start arriving.
StatusOr<std::string> readMessage(int fd, std::chrono::milliseconds timeout) {
  std::string header(4, '\0');
  size_t got = 0;
  auto deadline = std::chrono::steady_clock::now() + timeout;
  auto readSome = [&](char* dst, size_t want) -> Status {
    while (got < want) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      pollfd p{fd, POLLIN, 0};
      int rc = ::poll(&p, 1, static_cast<int>(std::max<int64_t>(0, left.count())));
      if (rc == 0) return Status(StatusCode::kDeadlineExceeded, "no answer from the store");
      if (rc < 0) {
        if (errno == EINTR) continue;
        return errnoStatus("poll");
      }
      ssize_t n = ::recv(fd, dst + got, want - got, 0);
      if (n == 0) return unavailable("the store closed the connection");
      if (n < 0) {
        if (errno == EINTR) continue;
        return errnoStatus("recv");
      }
      got += static_cast<size_t>(n);
    }
    return Status::ok();
  };
  RETURN_IF_ERROR(readSome(header.data(), 4));
  uint32_t n;
  std::memcpy(&n, header.data(), 4);
  std::string payload(n, '\0');
  got = 0;
  RETURN_IF_ERROR(readSome(payload.data(), n));
  return payload;
}

}  // namespace

// The server: one thread polling the listening socket and every client. Requests never block,
// so one slow client cannot hold up the others.
class TcpStore::Server {
 public:
  static StatusOr<std::unique_ptr<Server>> listen(int port) {
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return errnoStatus("socket");
    int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_ANY);
    addr.sin_port = htons(static_cast<uint16_t>(port));
    if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || ::listen(fd, 1024) != 0) {
      Status s = errnoStatus(fmt::format("store: listening on port {}", port));
      ::close(fd);
      return s;
    }
    return std::unique_ptr<Server>(new Server(fd));
  }

  ~Server() {
    uint64_t one = 1;
    (void)!::write(wake_, &one, sizeof one);
    thread_.join();
    for (int c : clients_) ::close(c);
    ::close(listen_);
    ::close(wake_);
  }

 private:
  explicit Server(int fd) : listen_(fd), wake_(::eventfd(0, EFD_CLOEXEC)) {
    thread_ = std::thread([this] { run(); });
  }

  void run() {
    std::map<int, std::string> buffers;
    for (;;) {
      std::vector<pollfd> fds{{wake_, POLLIN, 0}, {listen_, POLLIN, 0}};
      for (int c : clients_) fds.push_back({c, POLLIN, 0});
      if (::poll(fds.data(), fds.size(), -1) < 0) {
        if (errno == EINTR) continue;
        return;
      }
      if (fds[0].revents) return;
      if (fds[1].revents & POLLIN) {
        int c = ::accept4(listen_, nullptr, nullptr, SOCK_CLOEXEC);
        if (c >= 0) {
          int one = 1;
          ::setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
          clients_.push_back(c);
        }
      }
      for (size_t i = 2; i < fds.size(); ++i) {
        if (!fds[i].revents) continue;
        int c = fds[i].fd;
        char buf[65536];
        ssize_t n = ::recv(c, buf, sizeof buf, 0);
        if (n <= 0) {
          ::close(c);
          clients_.erase(std::find(clients_.begin(), clients_.end(), c));
          buffers.erase(c);
          continue;
        }
        std::string& in = buffers[c];
        in.append(buf, static_cast<size_t>(n));
        while (in.size() >= 4) {
          uint32_t len;
          std::memcpy(&len, in.data(), 4);
          if (in.size() < 4 + len) break;
          std::string reply = handle(in.substr(4, len));
          in.erase(0, 4 + len);
          sendMessage(c, reply);
        }
      }
    }
  }

  std::string handle(const std::string& request) {
    if (request.empty()) return "E";
    size_t pos = 1;
    std::string key, value, reply;
    switch (request[0]) {
      case 'S':
        if (!takeString(request, pos, &key) || !takeString(request, pos, &value)) return "E";
        data_[key] = value;
        return "K";
      case 'G':
        reply = "K";
        while (takeString(request, pos, &key)) {
          auto it = data_.find(key);
          reply += it == data_.end() ? '0' : '1';
          putString(reply, it == data_.end() ? std::string() : it->second);
        }
        return reply;
      case 'A': {
        if (!takeString(request, pos, &key) || !takeString(request, pos, &value)) return "E";
        int64_t current = 0, delta = 0;
        const std::string& stored = data_[key];
        if (!stored.empty() && std::from_chars(stored.data(), stored.data() + stored.size(), current).ec != std::errc())
          return "E";
        if (std::from_chars(value.data(), value.data() + value.size(), delta).ec != std::errc()) return "E";
        int64_t v = current + delta;
        data_[key] = std::to_string(v);
        reply = "K";
        putString(reply, data_[key]);
        return reply;
      }
    }
    return "E";
  }

  int listen_;
  int wake_;
  std::vector<int> clients_;
  std::map<std::string, std::string> data_;
  std::thread thread_;
};

StatusOr<std::unique_ptr<TcpStore>> TcpStore::connect(const Options& options) {
  std::unique_ptr<TcpStore> store(new TcpStore());
  store->where_ = fmt::format("{}:{}", options.host, options.port);
  if (options.isServer) {
    ASSIGN_OR_RETURN(store->server_, Server::listen(options.port));
  }

  addrinfo hints{}, *found = nullptr;
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  if (int rc = ::getaddrinfo(options.host.c_str(), std::to_string(options.port).c_str(), &hints, &found); rc != 0)
    return invalidArgument("store: cannot resolve {}: {}", options.host, gai_strerror(rc));
  std::unique_ptr<addrinfo, void (*)(addrinfo*)> cleanup(found, freeaddrinfo);

  // Rank 0 may not be listening yet: retry until the timeout.
  auto deadline = std::chrono::steady_clock::now() + options.connectTimeout;
  int delayMs = 5;
  for (;;) {
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return errnoStatus("socket");
    if (::connect(fd, found->ai_addr, found->ai_addrlen) == 0) {
      int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      store->fd_ = fd;
      return store;
    }
    int err = errno;
    ::close(fd);
    if (std::chrono::steady_clock::now() >= deadline)
      return unavailable("store: cannot reach rank 0's store at {} within {} s: {}", store->where_,
                         options.connectTimeout.count() / 1000.0, std::strerror(err));
    std::this_thread::sleep_for(std::chrono::milliseconds(delayMs));
    delayMs = std::min(delayMs * 2, 200);
  }
}

TcpStore::~TcpStore() {
  if (fd_ >= 0) ::close(fd_);
}

StatusOr<std::string> TcpStore::call(const std::string& request, std::chrono::milliseconds timeout) {
  std::lock_guard lock(mu_);
  if (fd_ < 0) return unavailable("store at {}: the connection failed earlier", where_);
  auto reply = sendMessage(fd_, request) ? readMessage(fd_, timeout)
                                         : StatusOr<std::string>(unavailable("connection lost"));
  if (!reply.isOk()) {
    // A late answer would be read as the next request's: the connection is done for.
    ::close(fd_);
    fd_ = -1;
    return reply.status().withContext("store at " + where_);
  }
  if (reply->empty() || (*reply)[0] != 'K') return internalError("store at {}: request refused", where_);
  return reply->substr(1);
}

Status TcpStore::set(const std::string& key, const std::string& value) {
  std::string request = "S";
  putString(request, key);
  putString(request, value);
  return call(request, std::chrono::seconds(30)).status();
}

StatusOr<std::vector<std::string>> TcpStore::get(const std::vector<std::string>& keys,
                                                 std::chrono::milliseconds timeout) {
  std::string request = "G";
  for (const auto& k : keys) putString(request, k);
  auto deadline = std::chrono::steady_clock::now() + timeout;
  int delayMs = 1;
  for (;;) {
    ASSIGN_OR_RETURN(std::string reply, call(request, std::chrono::seconds(30)));
    std::vector<std::string> values(keys.size());
    std::vector<std::string> missing;
    size_t pos = 0;
    for (size_t i = 0; i < keys.size(); ++i) {
      if (pos >= reply.size()) return internalError("store at {}: short reply", where_);
      bool present = reply[pos++] == '1';
      if (!takeString(reply, pos, &values[i])) return internalError("store at {}: short reply", where_);
      if (!present) missing.push_back(keys[i]);
    }
    if (missing.empty()) return values;
    if (std::chrono::steady_clock::now() >= deadline) {
      std::string list;
      for (const auto& m : missing) list += (list.empty() ? "" : ", ") + m;
      return Status(StatusCode::kDeadlineExceeded, fmt::format("still missing after {} s: {}", timeout.count() / 1000.0, list));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(delayMs));
    delayMs = std::min(delayMs * 2, 20);
  }
}

StatusOr<int64_t> TcpStore::add(const std::string& key, int64_t delta) {
  std::string request = "A";
  putString(request, key);
  putString(request, std::to_string(delta));
  ASSIGN_OR_RETURN(std::string reply, call(request, std::chrono::seconds(30)));
  size_t pos = 0;
  std::string value;
  if (!takeString(reply, pos, &value)) return internalError("store at {}: short reply", where_);
  return std::stoll(value);
}

}  // namespace loom::backends
