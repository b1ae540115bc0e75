#include "daemon/planner_link.h"

#include <spdlog/spdlog.h>

#include "proto/convert.h"

namespace loom::daemon {

PlannerLink::PlannerLink(std::shared_ptr<grpc::Channel> channel, PlannerOrders* orders)
    : channel_(std::move(channel)), stub_(v1::NodeService::NewStub(channel_)), orders_(orders) {}

PlannerLink::~PlannerLink() { stop(); }

void PlannerLink::start() {
  thread_ = std::thread([this] { run(); });
  heartbeat_ = std::thread([this] {
    std::unique_lock lock(mu_);
    while (!stopping_) {
      cv_.wait_for(lock, std::chrono::milliseconds(heartbeatIntervalMs_.load()));
      if (stopping_ || !stream_ || !connected_) continue;
      v1::NodeMessage m;
      m.mutable_heartbeat();
      stream_->Write(m);
    }
  });
}

void PlannerLink::stop() {
  if (stopping_.exchange(true)) return;
  {
    std::lock_guard lock(mu_);
    if (context_) context_->TryCancel();
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  if (heartbeat_.joinable()) heartbeat_.join();
}

void PlannerLink::run() {
  int64_t backoffMs = 100;
  while (!stopping_) {
    auto began = std::chrono::steady_clock::now();
    runStream();
    if (stopping_) break;
    // A stream that lived a while was a working connection: start the backoff over.
    if (std::chrono::steady_clock::now() - began > std::chrono::seconds(5)) backoffMs = 100;
    std::unique_lock lock(mu_);
    cv_.wait_for(lock, std::chrono::milliseconds(backoffMs), [this] { return stopping_.load(); });
    backoffMs = std::min<int64_t>(backoffMs * 2, 2000);
  }
}

void PlannerLink::runStream() {
  {
    std::lock_guard lock(mu_);
    // Checked under the lock stop() takes to cancel: a stop between the loop's check and here
    // would otherwise cancel the previous context and leave this one waiting forever.
    if (stopping_) return;
    context_ = std::make_unique<grpc::ClientContext>();
    context_->set_wait_for_ready(true);
    stream_ = stub_->Attach(context_.get());
  }
  v1::NodeMessage hello;
  *hello.mutable_register_() = convert::toProto(orders_->registration());
  if (!write(hello)) {
    std::lock_guard lock(mu_);
    stream_->Finish();
    stream_.reset();
    return;
  }
  v1::PlannerMessage in;
  while (stream_->Read(&in)) {
    switch (in.msg_case()) {
      case v1::PlannerMessage::kRegistered:
        heartbeatIntervalMs_ = std::max<int64_t>(100, in.registered().heartbeat_interval_ms());
        if (!connected_.exchange(true)) spdlog::info("attached to the planner");
        cv_.notify_all();
        // Reports made between the registration's snapshot and now were dropped (not yet
        // connected): send every rank's latest state once more. The planner ignores repeats.
        for (const auto& report : orders_->registration().ranks) sendRankReport(report);
        break;
      case v1::PlannerMessage::kLaunch:
        orders_->onLaunch(convert::fromProto(in.launch()));
        break;
      case v1::PlannerMessage::kKill:
        orders_->onKill(convert::fromProto(in.kill()));
        break;
      case v1::PlannerMessage::kRelease:
        orders_->onRelease(convert::fromProto(in.release()));
        break;
      case v1::PlannerMessage::kLogRequest:
        orders_->onLogRequest(convert::fromProto(in.log_request()));
        break;
      case v1::PlannerMessage::kLogCancel:
        orders_->onLogCancel(in.log_cancel().request_id());
        break;
      case v1::PlannerMessage::MSG_NOT_SET:
        break;
    }
  }
  bool wasConnected = connected_.exchange(false);
  orders_->onDisconnected();
  grpc::Status status;
  {
    std::lock_guard lock(mu_);
    status = stream_->Finish();
    stream_.reset();
  }
  if (!stopping_ && (wasConnected || !status.ok()))
    spdlog::warn("{} ({}); reconnecting", wasConnected ? "lost the planner" : "the planner refused this node",
                 status.ok() ? "stream closed" : status.error_message());
}

bool PlannerLink::write(const v1::NodeMessage& message) {
  std::lock_guard lock(mu_);
  return stream_ && stream_->Write(message);
}

void PlannerLink::sendRankReport(const RankReport& report) {
  if (!connected_) return;
  v1::NodeMessage m;
  *m.mutable_rank_report() = convert::toProto(report);
  write(m);
}

void PlannerLink::sendMasterEndpoint(const MasterEndpoint& endpoint) {
  v1::NodeMessage m;
  *m.mutable_master_endpoint() = convert::toProto(endpoint);
  write(m);
}

void PlannerLink::sendLogData(const LogData& data) {
  v1::NodeMessage m;
  *m.mutable_log_data() = convert::toProto(data);
  write(m);
}

void PlannerLink::sendDraining() {
  v1::NodeMessage m;
  m.mutable_draining();
  write(m);
}

}  // namespace loom::daemon
