#include "client/loomctl/output.h"

#include <ctime>

#include <fmt/format.h>
#include <google/protobuf/util/json_util.h>

#include "client/loom_client.h"

namespace loom::loomctl {

std::string toJson(const google::protobuf::Message& message) {
  std::string out;
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.preserve_proto_field_names = true;
  (void)google::protobuf::util::MessageToJsonString(message, &out, options);
  return out;
}

std::string toJsonLine(const google::protobuf::Message& message) {
  std::string out;
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  (void)google::protobuf::util::MessageToJsonString(message, &out, options);
  return out;
}

std::string formatTime(int64_t ms) {
  std::time_t t = ms / 1000;
  std::tm tm{};
  localtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S", &tm);
  return buf;
}

static std::string rankStateName(v1::RankState s) {
  std::string name = v1::RankState_Name(s);
  return name.rfind("RANK_", 0) == 0 ? name.substr(5) : name;
}

std::string describeJob(const v1::Job& job) {
  std::string out;
  out += fmt::format("Job:       {}\n", job.id());
  out += fmt::format("Kind:      {} ({} rank{})\n", job.kind(), job.world_size(), job.world_size() == 1 ? "" : "s");
  if (!job.owner().empty())
    out += fmt::format("Owner:     {}{}\n", job.owner(), job.tenant().empty() ? "" : " (tenant " + job.tenant() + ")");
  out += fmt::format("State:     {}\n", client::stateName(job.state()));
  out += fmt::format("Reason:    {}\n", job.reason());
  out += fmt::format("Attempt:   {} (restarts {} of {}{})\n", job.attempt(), job.restarts(), job.max_restarts(),
                     job.preemptions() > 0 ? fmt::format(", preemptions {}", job.preemptions()) : "");
  out += fmt::format("Created:   {}\n", formatTime(job.create_time_ms()));
  out += fmt::format("Updated:   {}\n", formatTime(job.update_time_ms()));
  if (job.ranks_size() > 0) {
    out += "Ranks:\n";
    out += fmt::format("  {:<5} {:<16} {:<8} {:<10} {:<6} {}\n", "RANK", "NODE", "PID", "STATE", "STEP", "DETAIL");
    for (const auto& r : job.ranks()) {
      out += fmt::format("  {:<5} {:<16} {:<8} {:<10} {:<6} {}\n", r.rank(), r.node_id(), r.pid(),
                         rankStateName(r.state()), r.step(), r.detail());
    }
  }
  if (!job.metrics().empty()) {
    out += "Metrics:\n";
    std::map<std::string, double> sorted(job.metrics().begin(), job.metrics().end());
    for (const auto& [name, value] : sorted) out += fmt::format("  {:<24} {:g}\n", name, value);
  }
  return out;
}

std::string jobTableHeader() {
  return fmt::format("{:<28} {:<8} {:<11} {:<6} {:<8} {:<20} {}\n", "ID", "KIND", "STATE", "RANKS", "ATTEMPT",
                     "CREATED", "REASON");
}

std::string jobTableRow(const v1::Job& job) {
  return fmt::format("{:<28} {:<8} {:<11} {:<6} {:<8} {:<20} {}\n", job.id(), job.kind(),
                     client::stateName(job.state()), job.world_size(), job.attempt(),
                     formatTime(job.create_time_ms()), job.reason());
}

std::string describeEvent(const v1::JobEvent& event) {
  return fmt::format("{}  {:<11} {}", formatTime(event.time_ms()), client::stateName(event.state()), event.reason());
}

int reportError(const Status& status) {
  std::fprintf(stderr, "loomctl: %s\n", status.toString().c_str());
  // Unavailable is also a job that does not serve yet; the hint is for a server not reached.
  if (status.code() == StatusCode::kUnavailable && status.message().find("connect") != std::string::npos)
    std::fprintf(stderr, "loomctl: is loom-planner (or loomd --standalone) running there? Set --server or LOOM_SERVER.\n");
  if (status.code() == StatusCode::kUnavailable && status.message().find("ssl") != std::string::npos)
    std::fprintf(stderr, "loomctl: a TLS handshake failed: does --ca hold the CA that signed the planner's certificate, "
                         "and does that certificate name the address (or --server-name)?\n");
  if (status.code() == StatusCode::kUnauthenticated)
    std::fprintf(stderr, "loomctl: give your credentials: --token-file (LOOM_TOKEN_FILE; a planner without --tokens "
                         "writes an admin's into STATE_DIR/admin.token) or --cert and --key with --ca\n");
  switch (status.code()) {
    case StatusCode::kInvalidArgument: return 2;
    case StatusCode::kNotFound: return 4;
    case StatusCode::kUnavailable: return 5;
    case StatusCode::kDeadlineExceeded: return 6;
    case StatusCode::kUnauthenticated:
    case StatusCode::kPermissionDenied: return 7;
    default: return 1;
  }
}

int exitCodeFor(v1::JobState state) {
  switch (state) {
    case v1::SUCCEEDED: return 0;
    case v1::CANCELLED: return 3;
    default: return 1;
  }
}

}  // namespace loom::loomctl
