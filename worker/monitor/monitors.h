#pragma once

#include <cstdint>
#include <fstream>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "common/status.h"
#include "planner/deepspeed_config.h"
#include "worker/monitor/monitor_event.h"
#include "worker/monitor/wandb_writer.h"

// DeepSpeed's monitors (its deepspeed/monitor/): what a train job's rank 0 writes for the
// `tensorboard`, `csv_monitor` and `wandb` sections of its DeepSpeed config, in DeepSpeed's files and with
// its tags, so that the tools pointed at a DeepSpeed run read a Loom run the same way.
namespace loom::worker {

// A TensorBoard event file (events.out.tfevents.*): TFRecord framing (length, masked CRC-32C)
// around tensorflow.Event messages, each with one simple_value, as torch's SummaryWriter's
// add_scalar writes them.
class TensorBoardWriter {
 public:
  static StatusOr<std::unique_ptr<TensorBoardWriter>> open(const std::string& directory);
  Status write(const std::vector<MonitorEvent>& events, double wallTime);
  const std::string& path() const { return path_; }

 private:
  Status record(const std::string& data);
  std::string path_;
  std::ofstream out_;
};

// DeepSpeed's csvMonitor: one <tag with '/' and ' ' as '_'>.csv per tag, its header
// "step,<last part of the tag>", then "samples,value" rows, as Python's csv module writes them
// (CRLF line ends, floats as Python's repr).
class CsvMonitorWriter {
 public:
  static StatusOr<std::unique_ptr<CsvMonitorWriter>> open(const std::string& directory);
  Status write(const std::vector<MonitorEvent>& events);

 private:
  std::string directory_;
};

// The enabled monitors of a config; write() goes to each.
class Monitors {
 public:
  // Null when no monitor is enabled. Creates their directories (output_path/job_name).
  static StatusOr<std::unique_ptr<Monitors>> open(const planner::DeepSpeedConfig& config);
  Status write(const std::vector<MonitorEvent>& events);
  // The job trained to its end: wandb's run ends with exit code 0 (without it, 1).
  Status finish();

 private:
  std::unique_ptr<TensorBoardWriter> tensorboard_;
  std::unique_ptr<CsvMonitorWriter> csv_;
  std::unique_ptr<WandbOfflineWriter> wandb_;
};

// CRC-32C (Castagnoli), masked as TFRecord frames carry it.
uint32_t maskedCrc32c(const std::string& data);

}  // namespace loom::worker
