#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

#include <grpcpp/grpcpp.h>

#include "common/node_messages.h"
#include "loom/v1/node.grpc.pb.h"

namespace loom::daemon {

// What the daemon does with the planner's orders. Called on the link's reader thread.
class PlannerOrders {
 public:
  virtual ~PlannerOrders() = default;
  // Builds the registration sent on every (re)connect: slots and every rank held.
  virtual NodeRegistration registration() = 0;
  virtual void onLaunch(LaunchOrder order) = 0;
  virtual void onKill(KillOrder order) = 0;
  virtual void onRelease(ReleaseOrder order) = 0;
  virtual void onLogRequest(LogQuery query) = 0;
  virtual void onLogCancel(int64_t requestId) = 0;
  // The stream broke: requests that were answered on it are void.
  virtual void onDisconnected() = 0;
};

// The daemon's end of the Attach stream. It dials out, registers, then reads orders; when the
// stream breaks it dials again with backoff, for as long as it runs. Sends while disconnected
// are dropped: the next registration carries every rank's latest state. send*() are
// thread-safe.
class PlannerLink {
 public:
  PlannerLink(std::shared_ptr<grpc::Channel> channel, PlannerOrders* orders);
  ~PlannerLink();  // stops and joins

  void start();
  void sendRankReport(const RankReport& report);
  void sendMasterEndpoint(const MasterEndpoint& endpoint);
  void sendLogData(const LogData& data);
  void sendDraining();
  bool connected() const { return connected_; }
  void stop();

 private:
  void run();
  void runStream();
  bool write(const v1::NodeMessage& message);

  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::NodeService::Stub> stub_;
  PlannerOrders* orders_;

  std::mutex mu_;  // guards stream_ and context_, and serializes writes
  std::condition_variable cv_;
  std::unique_ptr<grpc::ClientContext> context_;
  std::unique_ptr<grpc::ClientReaderWriter<v1::NodeMessage, v1::PlannerMessage>> stream_;
  std::atomic<bool> connected_{false};
  std::atomic<bool> stopping_{false};
  std::atomic<int64_t> heartbeatIntervalMs_{1000};
  std::thread thread_;
  std::thread heartbeat_;
};

}  // namespace loom::daemon
