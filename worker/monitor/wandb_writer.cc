#include "worker/monitor/wandb_writer.h"

#include <chrono>
#include <cmath>
#include <ctime>
#include <random>

#include <fmt/format.h>
#include <unistd.h>
#include <zlib.h>

#include "common/files.h"
#include "common/version.h"
#include "worker/monitor/proto_wire.h"

namespace loom::worker {

namespace {

using wire::putBytesField;
using wire::putStringField;
using wire::putVarintField;

// wandb_internal.Record's fields (wandb/proto/wandb_internal.proto).
enum RecordField { kNum = 1, kHistory = 2, kSummary = 3, kRun = 17, kExit = 18, kFinal = 20, kHeader = 21, kInfo = 200 };

// The log format: 32 KiB blocks; a chunk is CRC-32 (over its type and payload), length, type,
// payload; a block's last bytes too few for a chunk header are zeros.
constexpr uint64_t kBlockSize = 32768;
constexpr uint64_t kChunkHeader = 7;
enum ChunkType : uint8_t { kFull = 1, kFirst = 2, kMiddle = 3, kLast = 4 };
// ":W&B", the magic 0xBEE1 (little-endian) and version 0.
constexpr char kFileHeader[] = {':', 'W', '&', 'B', '\xE1', '\xBE', '\x00'};

double now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// A value as wandb's json.dumps writes it (NaN and infinities as JavaScript's names).
std::string jsonNumber(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "Infinity" : "-Infinity";
  return pythonFloat(v);
}

// An item of a config, history or summary record: key = 1, value_json = 16.
std::string item(const std::string& key, const std::string& valueJson) {
  std::string i;
  putStringField(i, 1, key);
  putStringField(i, 16, valueJson);
  return i;
}

// wandb's run ids: 8 characters of [a-z0-9].
std::string newRunId() {
  static const char kAlphabet[] = "abcdefghijklmnopqrstuvwxyz0123456789";
  std::random_device seed;
  std::mt19937 rng(seed());
  std::uniform_int_distribution<int> pick(0, 35);
  std::string id;
  for (int i = 0; i < 8; ++i) id += kAlphabet[pick(rng)];
  return id;
}

std::string hostName() {
  char name[256] = {};
  return ::gethostname(name, sizeof name - 1) == 0 ? name : "";
}

}  // namespace

StatusOr<std::unique_ptr<WandbOfflineWriter>> WandbOfflineWriter::open(const std::string& directory, const Run& run) {
  std::unique_ptr<WandbOfflineWriter> w(new WandbOfflineWriter());
  w->startTime_ = now();
  w->runId_ = newRunId();
  const std::time_t started = static_cast<std::time_t>(w->startTime_);
  std::tm local{};
  ::localtime_r(&started, &local);
  char stamp[32];
  std::strftime(stamp, sizeof stamp, "%Y%m%d_%H%M%S", &local);
  w->runDirectory_ = fmt::format("{}/wandb/offline-run-{}-{}", directory, stamp, w->runId_);
  // `wandb sync` reads files/ (empty here: it makes config.yaml and the summary from the log).
  RETURN_IF_ERROR(files::makeDirs(w->runDirectory_ + "/files").withContext("deepspeed.wandb.dir"));
  const std::string path = fmt::format("{}/run-{}.wandb", w->runDirectory_, w->runId_);
  w->out_.open(path, std::ios::binary | std::ios::trunc);
  if (!w->out_) return errnoStatus("deepspeed.wandb: cannot write " + path);
  w->out_.write(kFileHeader, sizeof kFileHeader);
  w->offset_ = sizeof kFileHeader;

  std::string info;  // _RecordInfo{stream_id = 1}
  putStringField(info, 1, w->runId_);
  std::string version;  // VersionInfo{producer = 1, min_consumer = 2}
  putStringField(version, 1, std::string("loom ") + kVersion);
  putStringField(version, 2, "0.70.0");
  std::string header;  // HeaderRecord{version_info = 1}
  putBytesField(header, 1, version);
  std::string body;
  putBytesField(body, kHeader, header);
  putBytesField(body, kInfo, info);
  RETURN_IF_ERROR(w->record(body));

  std::string startTime;  // google.protobuf.Timestamp{seconds = 1, nanos = 2}
  putVarintField(startTime, 1, static_cast<int64_t>(w->startTime_));
  putVarintField(startTime, 2, static_cast<int64_t>((w->startTime_ - std::floor(w->startTime_)) * 1e9));
  std::string runRecord;  // RunRecord{run_id 1, entity 2, project 3, run_group 6, host 13, start_time 17}
  putStringField(runRecord, 1, w->runId_);
  putStringField(runRecord, 2, run.entity);
  putStringField(runRecord, 3, run.project);
  putStringField(runRecord, 6, run.group);
  putStringField(runRecord, 13, hostName());
  putBytesField(runRecord, 17, startTime);
  body.clear();
  putBytesField(body, kRun, runRecord);
  putBytesField(body, kInfo, info);
  RETURN_IF_ERROR(w->record(body));
  return w;
}

WandbOfflineWriter::~WandbOfflineWriter() {
  if (!finished_ && out_.is_open()) (void)finish(1);
}

Status WandbOfflineWriter::write(const std::vector<MonitorEvent>& events) {
  for (const MonitorEvent& e : events) {
    if (hasRow_ && e.samples < rowStep_) continue;  // wandb drops a step below the last
    if (hasRow_ && e.samples > rowStep_) RETURN_IF_ERROR(flushRow());
    hasRow_ = true;
    rowStep_ = e.samples;
    row_[e.tag] = e.value;
  }
  return Status::ok();
}

Status WandbOfflineWriter::flushRow() {
  if (!hasRow_) return Status::ok();
  const double timestamp = now();
  std::string history;  // HistoryRecord{item = 1 (HistoryItem), step = 2 (HistoryStep{num = 1})}
  auto add = [&](const std::string& key, const std::string& valueJson) {
    putBytesField(history, 1, item(key, valueJson));
    summary_[key] = valueJson;
  };
  for (const auto& [key, value] : row_) add(key, jsonNumber(value));
  add("_step", std::to_string(rowStep_));
  add("_runtime", pythonFloat(timestamp - startTime_));
  add("_timestamp", pythonFloat(timestamp));
  std::string step;
  putVarintField(step, 1, rowStep_);
  putBytesField(history, 2, step);
  std::string body;
  putBytesField(body, kHistory, history);
  row_.clear();
  hasRow_ = false;
  return record(body);
}

Status WandbOfflineWriter::finish(int exitCode) {
  if (finished_) return Status::ok();
  finished_ = true;
  RETURN_IF_ERROR(flushRow());
  std::string summary;  // SummaryRecord{update = 1 (SummaryItem)}
  for (const auto& [key, valueJson] : summary_) putBytesField(summary, 1, item(key, valueJson));
  std::string body;
  putBytesField(body, kSummary, summary);
  RETURN_IF_ERROR(record(body));
  std::string exit;  // RunExitRecord{exit_code = 1, runtime = 2 (whole seconds)}
  putVarintField(exit, 1, exitCode);
  putVarintField(exit, 2, static_cast<int64_t>(now() - startTime_));
  body.clear();
  putBytesField(body, kExit, exit);
  RETURN_IF_ERROR(record(body));
  // An empty FinalRecord, which wandb's older (Python) sync waits for.
  body.clear();
  putBytesField(body, kFinal, "");
  RETURN_IF_ERROR(record(body));
  out_.close();
  return Status::ok();
}

Status WandbOfflineWriter::record(const std::string& body) {
  std::string payload;
  putVarintField(payload, kNum, ++recordNum_);
  payload += body;
  RETURN_IF_ERROR(writeChunked(payload));
  // Every record reaches the file as it is made: a rank that dies leaves the steps it logged.
  out_.flush();
  if (!out_) return errnoStatus(fmt::format("deepspeed.wandb: cannot write {}/run-{}.wandb", runDirectory_, runId_));
  return Status::ok();
}

Status WandbOfflineWriter::writeChunked(const std::string& payload) {
  size_t done = 0;
  bool first = true;
  for (;;) {
    uint64_t left = kBlockSize - offset_ % kBlockSize;
    if (left < kChunkHeader) {
      out_.write(std::string(left, '\0').data(), static_cast<std::streamsize>(left));
      offset_ += left;
      left = kBlockSize;
    }
    const size_t room = left - kChunkHeader;
    const size_t length = std::min(room, payload.size() - done);
    const bool last = done + length == payload.size();
    const uint8_t type = first ? (last ? kFull : kFirst) : (last ? kLast : kMiddle);
    uLong crc = crc32(0L, &type, 1);
    crc = crc32(crc, reinterpret_cast<const Bytef*>(payload.data() + done), static_cast<uInt>(length));
    std::string header;
    wire::putLittleEndian(header, static_cast<uint32_t>(crc));
    wire::putLittleEndian(header, static_cast<uint16_t>(length));
    header += static_cast<char>(type);
    out_.write(header.data(), static_cast<std::streamsize>(header.size()));
    out_.write(payload.data() + done, static_cast<std::streamsize>(length));
    offset_ += kChunkHeader + length;
    done += length;
    first = false;
    if (last) return Status::ok();
  }
}

}  // namespace loom::worker
