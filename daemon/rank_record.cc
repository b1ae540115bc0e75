#include "daemon/rank_record.h"

#include <nlohmann/json.hpp>

namespace loom::daemon {

using nlohmann::json;

std::string recordToJson(const RankRecord& r) {
  json report{{"event", static_cast<int>(r.lastReport.event)}, {"pid", r.lastReport.pid},
              {"exit_code", r.lastReport.exitCode}, {"signal", r.lastReport.signal},
              {"detail", r.lastReport.detail}, {"time_ms", r.lastReport.timeMs},
              {"service_address", r.lastReport.serviceAddress}};
  return json{{"job_id", r.jobId}, {"attempt", r.attempt}, {"rank", r.rank}, {"local_rank", r.localRank},
              {"pid", r.pid}, {"start_time", r.startTime}, {"log_path", r.logPath}, {"rank_dir", r.rankDir},
              {"heartbeat_timeout_ms", r.heartbeatTimeoutMs}, {"exited", r.exited}, {"gpu", r.gpu},
              {"last_report", report}}
      .dump();
}

StatusOr<RankRecord> recordFromJson(const std::string& text) {
  try {
    json j = json::parse(text);
    RankRecord r;
    r.jobId = j.at("job_id");
    r.attempt = j.at("attempt");
    r.rank = j.at("rank");
    r.localRank = j.at("local_rank");
    r.pid = j.at("pid");
    r.startTime = j.at("start_time");
    r.logPath = j.at("log_path");
    r.rankDir = j.at("rank_dir");
    r.heartbeatTimeoutMs = j.at("heartbeat_timeout_ms");
    r.exited = j.at("exited");
    r.gpu = j.value("gpu", -1);  // records written before GPUs were counted hold none
    const json& rep = j.at("last_report");
    r.lastReport = RankReport{.jobId = r.jobId, .attempt = r.attempt, .rank = r.rank,
                              .event = static_cast<RankEvent>(rep.at("event").get<int>()), .pid = rep.at("pid"),
                              .exitCode = rep.at("exit_code"), .signal = rep.at("signal"), .detail = rep.at("detail"),
                              .step = 0, .metrics = {}, .timeMs = rep.at("time_ms"),
                              .serviceAddress = rep.value("service_address", std::string())};
    return r;
  } catch (const json::exception& e) {
    return invalidArgument("rank record: {}", e.what());
  }
}

}  // namespace loom::daemon
