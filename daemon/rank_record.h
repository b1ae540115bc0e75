#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "common/node_messages.h"
#include "common/status.h"

namespace loom::daemon {

// One rank process this daemon launched (or re-adopted), persisted in the state directory so a
// restarted daemon finds it again. The last report is kept until the planner releases the
// attempt, so a planner that was away learns how the rank ended.
struct RankRecord {
  std::string jobId;
  int attempt = 0;
  int rank = 0;
  int localRank = 0;
  int pid = 0;
  uint64_t startTime = 0;  // /proc start time: with pid, names the process without reuse risk
  std::string logPath;
  std::string rankDir;     // per-rank scratch; the worker writes exit_status there
  int64_t heartbeatTimeoutMs = 0;
  int gpu = -1;            // the GPU it holds (DaemonOptions::gpus), -1: none
  RankReport lastReport;   // the latest lifecycle report (STARTED / READY / EXITED / ...)
  bool exited = false;

  // Volatile: not persisted.
  bool child = true;             // false for re-adopted ranks (not our children: polled via /proc)
  int64_t lastHeartbeatMs = 0;   // steady clock
  int64_t killDeadlineMs = 0;    // SIGKILL after this (steady clock); 0: none pending
  bool stopping = false;         // a kill was ordered: silence is expected, not a lost heartbeat
  bool heartbeatLost = false;
  std::string failure;           // what the rank said before exiting non-zero
  // Reaped (its wait status here), but not yet reported as exited: its last datagrams, sent
  // before it exited, are handled first (ReportSocket::afterQueued).
  std::optional<int> reapedStatus;
  int64_t step = 0;              // the last step the rank reported (its progress)

  std::string key() const { return jobId + "." + std::to_string(attempt) + "." + std::to_string(rank); }
};

std::string recordToJson(const RankRecord& record);
StatusOr<RankRecord> recordFromJson(const std::string& json);

}  // namespace loom::daemon
