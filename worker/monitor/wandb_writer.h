#pragma once

#include <cstdint>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "worker/monitor/monitor_event.h"

namespace loom::worker {

// DeepSpeed's WandbMonitor, with wandb in offline mode (WANDB_MODE=offline): the run directory
// wandb itself writes, for `wandb sync` to upload later:
//   DIR/wandb/offline-run-YYYYMMDD_HHMMSS-ID/run-ID.wandb, and files/
// run-ID.wandb is wandb's transaction log: a ":W&B" header, then LevelDB's log format (32 KiB
// blocks; chunks of CRC-32, length, type and payload) around wandb_internal.Record messages: the
// run (project, entity = DeepSpeed's team, group), a history row per step, the summary and the
// exit record.
//
// As wandb.log(data, step=samples) merges DeepSpeed's events of one step into one row and drops
// a step smaller than the last, a row is written once a later step arrives, or at finish.
class WandbOfflineWriter {
 public:
  struct Run {
    std::string project;
    std::string entity;  // DeepSpeed's `team`
    std::string group;
  };

  static StatusOr<std::unique_ptr<WandbOfflineWriter>> open(const std::string& directory, const Run& run);
  // Ends the run as failed (exit code 1) unless finish() ended it: a train job that stopped on an
  // error, as the wandb SDK marks a process that raised.
  ~WandbOfflineWriter();

  Status write(const std::vector<MonitorEvent>& events);
  // The last row, the summary (each key's last value) and the exit record with `exitCode`.
  Status finish(int exitCode = 0);
  const std::string& runDirectory() const { return runDirectory_; }

 private:
  WandbOfflineWriter() = default;
  Status record(const std::string& body);  // a Record: its num, then `body`'s fields
  Status flushRow();
  Status writeChunked(const std::string& payload);

  std::string runDirectory_;
  std::string runId_;
  std::ofstream out_;
  uint64_t offset_ = 0;  // bytes written, header included
  int64_t recordNum_ = 0;
  double startTime_ = 0;
  bool finished_ = false;
  bool hasRow_ = false;
  int64_t rowStep_ = 0;
  std::map<std::string, double> row_;
  std::map<std::string, std::string> summary_;  // key -> value_json
};

}  // namespace loom::worker
