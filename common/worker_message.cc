#include "common/worker_message.h"

#include <nlohmann/json.hpp>

namespace loom {

using nlohmann::json;

static const char* typeName(WorkerMessage::Type t) {
  switch (t) {
    case WorkerMessage::Type::kHeartbeat: return "heartbeat";
    case WorkerMessage::Type::kReady: return "ready";
    case WorkerMessage::Type::kProgress: return "progress";
    case WorkerMessage::Type::kFailing: return "failing";
  }
  return "heartbeat";
}

std::string WorkerMessage::encode() const {
  json j{{"type", typeName(type)}, {"job", jobId}, {"attempt", attempt}, {"rank", rank}, {"pid", pid}};
  if (type == Type::kProgress) {
    j["step"] = step;
    j["metrics"] = metrics;
  }
  if (!detail.empty()) j["detail"] = detail;
  if (!serviceAddress.empty()) j["service_address"] = serviceAddress;
  return j.dump();
}

StatusOr<WorkerMessage> WorkerMessage::decode(const std::string& datagram) {
  try {
    json j = json::parse(datagram);
    WorkerMessage m;
    std::string type = j.at("type");
    if (type == "heartbeat") {
      m.type = Type::kHeartbeat;
    } else if (type == "ready") {
      m.type = Type::kReady;
    } else if (type == "progress") {
      m.type = Type::kProgress;
    } else if (type == "failing") {
      m.type = Type::kFailing;
    } else {
      return invalidArgument("worker message: unknown type \"{}\"", type);
    }
    m.jobId = j.at("job");
    m.attempt = j.at("attempt");
    m.rank = j.at("rank");
    m.pid = j.at("pid");
    m.step = j.value("step", int64_t{0});
    if (j.contains("metrics")) m.metrics = j.at("metrics").get<std::map<std::string, double>>();
    m.detail = j.value("detail", std::string());
    m.serviceAddress = j.value("service_address", std::string());
    return m;
  } catch (const json::exception& e) {
    return invalidArgument("worker message: {}", e.what());
  }
}

}  // namespace loom
