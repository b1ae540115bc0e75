#include "common/http_listen.h"

#include <chrono>
#include <cstdlib>

#include <sys/socket.h>

namespace loom {

StatusOr<std::unique_ptr<httplib::Server>> makeHttpServer(const std::string& certFile, const std::string& keyFile,
                                                          const std::string& option) {
  if (certFile.empty() && keyFile.empty()) return std::make_unique<httplib::Server>();
  if (certFile.empty() || keyFile.empty()) return invalidArgument("{}: HTTPS needs both a certificate and its key", option);
  auto https = std::make_unique<httplib::SSLServer>(certFile.c_str(), keyFile.c_str());
  if (!https->is_valid())
    return invalidArgument("{}: cannot serve HTTPS with {} and {} (not a PEM certificate and its key?)", option,
                           certFile, keyFile);
  return std::unique_ptr<httplib::Server>(std::move(https));
}

StatusOr<std::unique_ptr<HttpListener>> HttpListener::start(std::unique_ptr<httplib::Server> server,
                                                            const std::string& address, const std::string& option) {
  const auto colon = address.rfind(':');
  if (colon == std::string::npos) return invalidArgument("{}: \"{}\" is not host:port", option, address);
  std::string host = address.substr(0, colon);
  if (host.size() > 1 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  char* end = nullptr;
  const long port = std::strtol(address.c_str() + colon + 1, &end, 10);
  if (colon + 1 == address.size() || *end != '\0' || port < 0 || port > 65535)
    return invalidArgument("{}: \"{}\" has no port number", option, address);

  // httplib's default also sets SO_REUSEPORT, with which a second server would share the port
  // (and its scrapes) instead of failing to start.
  server->set_socket_options([](int socket) {
    int yes = 1;
    ::setsockopt(socket, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
  });
  const int bound = port == 0 ? server->bind_to_any_port(host) : (server->bind_to_port(host, port) ? port : -1);
  if (bound <= 0)
    return unavailable("{}: cannot serve HTTP on {} (in use, or not an address of this host)", option, address);
  std::unique_ptr<HttpListener> listener(new HttpListener());
  listener->boundAddress_ = address.substr(0, colon) + ":" + std::to_string(bound);
  listener->server_ = std::move(server);
  listener->thread_ = std::thread([server = listener->server_.get()] { server->listen_after_bind(); });
  // stop() before the loop runs would not end it: wait until it does.
  for (int i = 0; i < 5000 && !listener->server_->is_running(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  return listener;
}

HttpListener::~HttpListener() { stop(); }

void HttpListener::stop() {
  if (!thread_.joinable()) return;
  server_->stop();
  thread_.join();
}

}  // namespace loom
