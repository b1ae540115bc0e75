#pragma once

#include <cstdint>
#include <fstream>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "common/status.h"
#include "planner/deepspeed_config.h"

// DeepSpeed's monitors (its deepspeed/monitor/): what a train job's rank 0 writes for the
// `tensorboard` and `csv_monitor` sections of its DeepSpeed config, in DeepSpeed's files and with
// its tags, so that the tools pointed at a DeepSpeed run read a Loom run the same way.
namespace loom::worker {

// One scalar, as DeepSpeed's write_events takes it: its x is the samples trained so far.
struct MonitorEvent {
  std::string tag;  // "Train/Samples/lr"
  double value;
  int64_t samples;
};

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

 private:
  std::unique_ptr<TensorBoardWriter> tensorboard_;
  std::unique_ptr<CsvMonitorWriter> csv_;
};

// A double as Python's repr() writes it ("0.001", "65536.0", "1e-05"): what DeepSpeed's CSV has.
std::string pythonFloat(double value);
// CRC-32C (Castagnoli), masked as TFRecord frames carry it.
uint32_t maskedCrc32c(const std::string& data);

}  // namespace loom::worker
