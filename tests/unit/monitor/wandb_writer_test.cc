#include "worker/monitor/wandb_writer.h"

#include <zlib.h>

#include <cstring>
#include <filesystem>

#include "common/files.h"
#include "tests/catch.h"
#include "tests/temp_dir.h"

using namespace loom;
using namespace loom::worker;

namespace {

// LevelDB's log format as wandb reads it: 32 KiB blocks, chunks of CRC-32 (type and payload),
// length and type; a block's tail shorter than a chunk header is zeros. The records, whole.
std::vector<std::string> readRecords(const std::string& text) {
  REQUIRE(text.substr(0, 7) == std::string(":W&B\xE1\xBE\x00", 7));
  std::vector<std::string> records;
  std::string pending;
  size_t pos = 7;
  while (pos < text.size()) {
    const size_t left = 32768 - pos % 32768;
    if (left < 7) {
      CHECK(text.substr(pos, left) == std::string(left, '\0'));
      pos += left;
      continue;
    }
    uint32_t crc = 0;
    uint16_t length = 0;
    std::memcpy(&crc, text.data() + pos, 4);
    std::memcpy(&length, text.data() + pos + 4, 2);
    const auto type = static_cast<uint8_t>(text[pos + 6]);
    REQUIRE(pos + 7 + length <= text.size());
    REQUIRE(length <= left - 7);
    const std::string data = text.substr(pos + 7, length);
    uLong expected = crc32(0L, &type, 1);
    expected = crc32(expected, reinterpret_cast<const Bytef*>(data.data()), static_cast<uInt>(data.size()));
    REQUIRE(crc == static_cast<uint32_t>(expected));
    pos += 7 + length;
    if (type == 1) records.push_back(data);
    if (type == 2) pending = data;
    if (type == 3) pending += data;
    if (type == 4) records.push_back(pending + data);
  }
  return records;
}

bool contains(const std::string& bytes, const std::string& part) { return bytes.find(part) != std::string::npos; }

std::string onlyRunFile(const std::string& directory) {
  std::vector<std::string> found;
  for (const auto& run : std::filesystem::directory_iterator(directory + "/wandb"))
    for (const auto& f : std::filesystem::directory_iterator(run.path()))
      if (f.path().extension() == ".wandb") found.push_back(f.path().string());
  REQUIRE(found.size() == 1);
  return found[0];
}

}  // namespace

TEST_CASE("wandb offline - the run directory, its records, rows merged by step", "[monitor]") {
  loom::testing::TempDir dir;
  auto writer = WandbOfflineWriter::open(dir.path(), {.project = "proj", .entity = "team", .group = "grp"});
  REQUIRE(writer.isOk());
  const std::string runDir = (*writer)->runDirectory();
  const std::string name = std::filesystem::path(runDir).filename().string();
  CHECK(name.rfind("offline-run-", 0) == 0);
  CHECK(std::filesystem::is_directory(runDir + "/files"));
  // One write_events call per step, as DeepSpeed's engine makes them; a step below the last is
  // dropped, as wandb.log drops it.
  REQUIRE((*writer)->write({{"Train/Samples/train_loss", 2.5, 8}, {"Train/Samples/lr", 1e-05, 8}}).isOk());
  REQUIRE((*writer)->write({{"Train/Samples/eval_loss", 2.75, 8}}).isOk());
  REQUIRE((*writer)->write({{"Train/Samples/train_loss", 2.25, 16}}).isOk());
  REQUIRE((*writer)->write({{"Train/Samples/train_loss", 9.0, 4}}).isOk());
  REQUIRE((*writer)->finish().isOk());
  const auto records = readRecords(files::readFile(onlyRunFile(dir.path())).value());
  // header, run, the rows of steps 8 and 16, summary, exit, final.
  REQUIRE(records.size() == 7);
  CHECK(contains(records[1], "proj"));
  CHECK(contains(records[1], "team"));
  CHECK(contains(records[1], "grp"));
  CHECK(contains(records[2], "Train/Samples/eval_loss"));
  CHECK(contains(records[2], "1e-05"));
  CHECK(contains(records[3], "2.25"));
  CHECK_FALSE(contains(records[3], "9.0"));
  CHECK(contains(records[4], "2.25"));      // the summary: each key's last value
  // Record{num 6, exit: RunExitRecord{exit_code 0 (proto3: absent), runtime}}, then an empty final.
  CHECK(records[5].substr(0, 4) == std::string("\x08\x06\x92\x01", 4));
  CHECK_FALSE(contains(records[5].substr(5), std::string("\x08", 1)));
  CHECK(records[6] == std::string("\x08\x07\xa2\x01\x00", 5));
}

TEST_CASE("wandb offline - records across blocks; a writer dropped unfinished ends the run failed", "[monitor]") {
  loom::testing::TempDir dir;
  {
    auto writer = WandbOfflineWriter::open(dir.path(), {.project = "p", .entity = "", .group = ""});
    REQUIRE(writer.isOk());
    // Rows of ~2.4 KB: chunks end at every offset of the 32 KiB blocks, and a row of 40 KB spans two.
    for (int64_t step = 1; step <= 100; ++step) {
      std::vector<MonitorEvent> row;
      for (int k = 0; k < 40; ++k) row.push_back({"Train/Samples/metric_with_a_long_name_" + std::to_string(k), 0.5, step});
      REQUIRE((*writer)->write(row).isOk());
    }
    std::vector<MonitorEvent> wide;
    for (int k = 0; k < 1400; ++k) wide.push_back({"Train/Samples/wide_" + std::to_string(k), 1.0, 101});
    REQUIRE((*writer)->write(wide).isOk());
  }
  const auto records = readRecords(files::readFile(onlyRunFile(dir.path())).value());
  REQUIRE(records.size() == 2 + 101 + 3);
  CHECK(records[102].size() > 32768);
  // RunExitRecord{exit_code 1}: field 18 of the Record, then its exit_code.
  CHECK(contains(records[104], std::string("\x92\x01", 2)));
  CHECK(contains(records[104], std::string("\x08\x01", 2)));
}
