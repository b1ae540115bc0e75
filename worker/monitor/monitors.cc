#include "worker/monitor/monitors.h"

#include <array>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>

#include <fmt/format.h>
#include <unistd.h>

#include "common/files.h"
#include "worker/monitor/proto_wire.h"

namespace loom::worker {

namespace {

using wire::putBytesField;
using wire::putLittleEndian;
using wire::putVarint;

uint32_t crc32c(const std::string& data) {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  uint32_t crc = 0xFFFFFFFFu;
  for (unsigned char byte : data) crc = table[(crc ^ byte) & 0xFF] ^ (crc >> 8);
  return crc ^ 0xFFFFFFFFu;
}

// tensorflow.Event{wall_time = 1, step = 2, file_version = 3 | summary = 5}.
std::string eventHeader(double wallTime, int64_t step) {
  std::string e;
  e += '\x09';  // field 1, fixed64
  putLittleEndian(e, wallTime);
  e += '\x10';  // field 2, varint
  putVarint(e, static_cast<uint64_t>(step));
  return e;
}

std::string scalarEvent(const MonitorEvent& event, double wallTime) {
  std::string value;  // Summary.Value{tag = 1, simple_value = 2}
  putBytesField(value, 1, event.tag);
  value += '\x15';  // field 2, fixed32
  putLittleEndian(value, static_cast<float>(event.value));
  std::string summary;  // Summary{value = 1}
  putBytesField(summary, 1, value);
  std::string e = eventHeader(wallTime, event.samples);
  putBytesField(e, 5, summary);
  return e;
}

double now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

uint32_t maskedCrc32c(const std::string& data) {
  const uint32_t crc = crc32c(data);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

std::string pythonFloat(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  // Python's repr: the shortest digits that read back, exponent form below 1e-4 and from 1e16.
  const double a = std::fabs(v);
  const int exponent = a == 0 ? 0 : static_cast<int>(std::floor(std::log10(a)));
  if (a != 0 && (exponent < -4 || exponent >= 16)) {
    std::string s;  // the fewest significant digits (1 to 17) that read back as v
    for (int precision = 1; precision <= 17; ++precision) {
      s = fmt::format("{:.{}e}", v, precision - 1);
      if (std::stod(s) == v) break;
    }
    // Python writes "1e-05", "1.5e+16": no trailing zeros in the mantissa, two exponent digits at least.
    const auto e = s.find('e');
    std::string mantissa = s.substr(0, e);
    if (mantissa.find('.') != std::string::npos) {
      mantissa.erase(mantissa.find_last_not_of('0') + 1);
      if (mantissa.back() == '.') mantissa.pop_back();
    }
    return mantissa + s.substr(e);
  }
  std::string s = fmt::format("{}", v);  // shortest round trip, fixed notation in this range
  if (s.find_first_of(".e") == std::string::npos) s += ".0";
  return s;
}

StatusOr<std::unique_ptr<TensorBoardWriter>> TensorBoardWriter::open(const std::string& directory) {
  RETURN_IF_ERROR(files::makeDirs(directory));
  char host[256] = {0};
  ::gethostname(host, sizeof host - 1);
  std::unique_ptr<TensorBoardWriter> writer(new TensorBoardWriter());
  writer->path_ = fmt::format("{}/events.out.tfevents.{:010d}.{}.{}.0", directory, static_cast<int64_t>(now()), host,
                              static_cast<int>(::getpid()));
  writer->out_.open(writer->path_, std::ios::binary | std::ios::app);
  if (!writer->out_) return unavailable("tensorboard: cannot create {}: {}", writer->path_, std::strerror(errno));
  std::string version = eventHeader(now(), 0);
  putBytesField(version, 3, "brain.Event:2");
  RETURN_IF_ERROR(writer->record(version));
  return writer;
}

Status TensorBoardWriter::record(const std::string& data) {
  std::string length;
  putLittleEndian(length, static_cast<uint64_t>(data.size()));
  std::string frame = length;
  putLittleEndian(frame, maskedCrc32c(length));
  frame += data;
  putLittleEndian(frame, maskedCrc32c(data));
  out_.write(frame.data(), static_cast<std::streamsize>(frame.size()));
  out_.flush();  // DeepSpeed flushes after every write_events too
  if (!out_) return unavailable("tensorboard: cannot write {}: {}", path_, std::strerror(errno));
  return Status::ok();
}

Status TensorBoardWriter::write(const std::vector<MonitorEvent>& events, double wallTime) {
  for (const auto& event : events) RETURN_IF_ERROR(record(scalarEvent(event, wallTime)));
  return Status::ok();
}

StatusOr<std::unique_ptr<CsvMonitorWriter>> CsvMonitorWriter::open(const std::string& directory) {
  RETURN_IF_ERROR(files::makeDirs(directory));
  std::unique_ptr<CsvMonitorWriter> writer(new CsvMonitorWriter());
  writer->directory_ = directory;
  return writer;
}

Status CsvMonitorWriter::write(const std::vector<MonitorEvent>& events) {
  for (const auto& event : events) {
    std::string name = event.tag;
    for (char& c : name) {
      if (c == '/' || c == ' ') c = '_';
    }
    const std::string path = directory_ + "/" + name + ".csv";
    const bool fresh = !std::filesystem::exists(path);  // a resumed job appends under its header
    std::ofstream out(path, std::ios::binary | std::ios::app);
    if (fresh) out << "step," << event.tag.substr(event.tag.rfind('/') + 1) << "\r\n";
    out << event.samples << ',' << pythonFloat(event.value) << "\r\n";
    if (!out) return unavailable("csv_monitor: cannot write {}: {}", path, std::strerror(errno));
  }
  return Status::ok();
}

StatusOr<std::unique_ptr<Monitors>> Monitors::open(const planner::DeepSpeedConfig& config) {
  if (!config.tensorboard.enabled && !config.csvMonitor.enabled && !config.wandb.enabled)
    return std::unique_ptr<Monitors>();
  auto monitors = std::make_unique<Monitors>();
  if (config.tensorboard.enabled) {
    ASSIGN_OR_RETURN(monitors->tensorboard_, TensorBoardWriter::open(config.tensorboard.directory()));
  }
  if (config.csvMonitor.enabled) {
    ASSIGN_OR_RETURN(monitors->csv_, CsvMonitorWriter::open(config.csvMonitor.directory()));
  }
  if (config.wandb.enabled) {
    ASSIGN_OR_RETURN(monitors->wandb_, WandbOfflineWriter::open(config.wandb.dir, {.project = config.wandb.project,
                                                                                   .entity = config.wandb.team,
                                                                                   .group = config.wandb.group}));
  }
  return monitors;
}

Status Monitors::write(const std::vector<MonitorEvent>& events) {
  if (tensorboard_) RETURN_IF_ERROR(tensorboard_->write(events, now()));
  if (csv_) RETURN_IF_ERROR(csv_->write(events));
  if (wandb_) RETURN_IF_ERROR(wandb_->write(events));
  return Status::ok();
}

Status Monitors::finish() { return wandb_ ? wandb_->finish(0) : Status::ok(); }

}  // namespace loom::worker
