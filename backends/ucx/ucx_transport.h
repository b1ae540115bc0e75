#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <ucp/api/ucp.h>

#include "backends/comms_logger.h"
#include "backends/rendezvous/store.h"
#include "backends/ucx/shared_heap.h"
#include "backends/work.h"
#include "common/status.h"

namespace loom::backends {

struct UcxOptions {
  int rank = 0;
  int worldSize = 1;
  Store* store = nullptr;                                  // for exchanging worker addresses
  std::chrono::milliseconds rendezvousTimeout{60'000};     // a rank that does not join by then is named
  std::chrono::milliseconds operationTimeout{300'000};     // the watchdog: an operation not done by then fails
  CommsLogger* logger = nullptr;                           // optional

  Status validate() const;
};

// One UCX worker per process with endpoints to every rank of the world, and the one thread that
// runs every collective of every communicator built on it, in the order they were issued. On
// that thread, algorithms post tagged sends and receives and progress the worker until they
// complete or the operation's deadline passes; then the operation fails, naming what it was
// waiting for, outstanding requests are cancelled, and the transport is broken: every later
// operation fails at once with the first error. Ranks on the same host are reached through
// UCX's shared-memory transports (which it picks only without peer error handling), others
// over TCP or RDMA.
class UcxTransport {
 public:
  static StatusOr<std::shared_ptr<UcxTransport>> create(const UcxOptions& options);
  ~UcxTransport();

  int rank() const { return options_.rank; }
  int worldSize() const { return options_.worldSize; }
  CommsLogger* logger() const { return options_.logger; }
  Store* store() const { return options_.store; }
  std::chrono::milliseconds rendezvousTimeout() const { return options_.rendezvousTimeout; }

  // A handle to one posted send or receive.
  struct Request {
    void* handle = nullptr;  // null: completed at once
    int peer = -1;           // world rank
    bool isReceive = false;
    std::string what;        // "receive of step 2 from rank 3"
    size_t bytes = 0;        // expected
  };

  // Runs `body` on the transport thread with the deadline of the operation; completes `work`.
  // An empty `opName` is not recorded by the comms logger.
  using Body = std::function<Status()>;
  void enqueue(std::shared_ptr<Work> work, const std::string& opName, int64_t bytes, int groupSize, Body body);

  // For algorithms, on the transport thread only.
  StatusOr<Request> postSend(int worldPeer, uint64_t tag, const void* buffer, size_t bytes, std::string what);
  StatusOr<Request> postReceive(int worldPeer, uint64_t tag, void* buffer, size_t bytes, std::string what);
  // Progresses until every request has completed, or fails at the current operation's deadline.
  Status waitAll(std::vector<Request>& requests);
  // Scratch memory kept between operations (fresh pages cost a fault each, and vectors zero
  // them): `slot` 0 and 1 are separate buffers. Contents are undefined.
  char* scratch(int slot, size_t bytes);
  // For waits outside UCX (the shared heap's): progress the worker once; progress it until every
  // message this rank has sent has reached its peer, or fail at the operation's deadline (errors
  // say what failed, without the operation: the waiter names it).
  void poll();
  Status flush();
  // The watchdog's error for the running operation, still waiting for `waitingFor`.
  Status overdue(const std::string& waitingFor) const;
  // Memory shared with every rank of the world when they are all on this host (else null).
  const std::shared_ptr<SharedHeap>& heap() const { return heap_; }
  // The running operation's deadline and description, for algorithms that wait on their own.
  std::chrono::steady_clock::time_point deadline() const { return deadline_; }
  const std::string& currentOperation() const { return current_; }

 private:
  explicit UcxTransport(const UcxOptions& options) : options_(options) {}
  Status start();
  StatusOr<ucp_ep_h> endpoint(int worldPeer);
  void run();

  struct Task {
    std::shared_ptr<Work> work;
    std::string opName;
    int64_t bytes;
    int groupSize;
    Body body;
  };
  void forget(void* handle);
  // After a failed operation: cancels its receives; sends UCX cannot cancel, so a task whose
  // sends are still in flight is kept (with its tensors) for the life of the transport.
  void abandonInflight(Task& task);

  UcxOptions options_;
  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  std::vector<std::string> peerAddresses_;
  std::vector<std::string> peerHosts_;
  std::vector<ucp_ep_h> endpoints_;
  std::string host_;
  std::shared_ptr<SharedHeap> heap_;

  std::chrono::steady_clock::time_point deadline_;  // of the running operation
  std::string current_;                              // its description
  Status broken_;                                    // the first failure, once there is one
  struct Scratch {
    std::unique_ptr<char[]> data;
    size_t size = 0;
  };
  Scratch scratch_[2];
  std::vector<Request> inflight_;   // every posted, not yet freed request of the running operation
  std::vector<Task> abandoned_;     // failed tasks whose buffers UCX may still touch

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Task> queue_;
  bool stopping_ = false;
  std::thread thread_;
};

// The 64-bit tag of a message: which group, from which rank of it, which operation, which part.
// Within one (group, source, operation) messages are told apart by `part`; UCX keeps messages of
// one tag from one sender in order, so parts may wrap.
uint64_t makeTag(uint32_t groupId, int sourceInGroup, uint32_t sequence, uint32_t part);
constexpr uint32_t kPointToPointSequence = 0xFFFFFF;  // collectives never use it

}  // namespace loom::backends
