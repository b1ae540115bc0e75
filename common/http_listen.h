#pragma once

#include <memory>
#include <string>
#include <thread>

#include <httplib.h>

#include "common/status.h"

namespace loom {

// An HTTPS server with this certificate and key (PEM files), or plain HTTP when both are empty;
// errors name `option`, the flag the files came from.
StatusOr<std::unique_ptr<httplib::Server>> makeHttpServer(const std::string& certFile, const std::string& keyFile,
                                                          const std::string& option);

// An httplib server with its routes set, listening on "host:port" (port 0: any free one) on a
// thread of its own until stop() or destruction. `option` names the command-line flag the
// address came from, for the error when it cannot be bound.
class HttpListener {
 public:
  static StatusOr<std::unique_ptr<HttpListener>> start(std::unique_ptr<httplib::Server> server,
                                                       const std::string& address, const std::string& option);
  ~HttpListener();

  // "host:port" with the port actually bound.
  const std::string& boundAddress() const { return boundAddress_; }
  void stop();

 private:
  HttpListener() = default;
  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
  std::string boundAddress_;
};

}  // namespace loom
