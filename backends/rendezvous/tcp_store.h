#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <thread>

#include "backends/rendezvous/store.h"

namespace loom::backends {

// The Store of one attempt, served by rank 0 on MASTER_ADDR:MASTER_PORT (a port loomd picks free
// for every attempt, so nothing is fixed) and reached by the other ranks over TCP. The server
// lives as long as rank 0's TcpStore.
class TcpStore final : public Store {
 public:
  struct Options {
    std::string host;
    int port = 0;
    bool isServer = false;
    std::chrono::milliseconds connectTimeout{30'000};
  };
  static StatusOr<std::unique_ptr<TcpStore>> connect(const Options& options);
  ~TcpStore() override;

  Status set(const std::string& key, const std::string& value) override;
  StatusOr<std::vector<std::string>> get(const std::vector<std::string>& keys,
                                         std::chrono::milliseconds timeout) override;
  StatusOr<int64_t> add(const std::string& key, int64_t delta) override;

 private:
  class Server;
  TcpStore() = default;
  StatusOr<std::string> call(const std::string& request, std::chrono::milliseconds timeout);

  std::unique_ptr<Server> server_;
  std::mutex mu_;  // one request at a time on the connection
  int fd_ = -1;
  std::string where_;
};

}  // namespace loom::backends
