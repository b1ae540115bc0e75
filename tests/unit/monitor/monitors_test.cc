#include "worker/monitor/model_flops.h"
#include "worker/monitor/monitors.h"

#include <filesystem>
#include <fstream>

#include "common/files.h"
#include "tests/catch.h"
#include "tests/temp_dir.h"

using namespace loom;
using namespace loom::worker;

TEST_CASE("monitors - floats as Python's repr writes them", "[monitor]") {
  CHECK(pythonFloat(0.001) == "0.001");
  CHECK(pythonFloat(65536.0) == "65536.0");
  CHECK(pythonFloat(1e-05) == "1e-05");
  CHECK(pythonFloat(0.0003) == "0.0003");
  CHECK(pythonFloat(2.5e-07) == "2.5e-07");
  CHECK(pythonFloat(1.5e16) == "1.5e+16");
  CHECK(pythonFloat(0.1 + 0.2) == "0.30000000000000004");
  CHECK(pythonFloat(0.0) == "0.0");
  CHECK(pythonFloat(-3.0) == "-3.0");
  CHECK(pythonFloat(123456789012345.6) == "123456789012345.6");
}

TEST_CASE("monitors - TFRecord's masked CRC-32C", "[monitor]") {
  // CRC-32C of "123456789" is 0xE3069283 (RFC 3720's check value); masked as TFRecord does.
  const uint32_t crc = 0xE3069283u;
  CHECK(maskedCrc32c("123456789") == ((crc >> 15) | (crc << 17)) + 0xa282ead8u);
}

TEST_CASE("monitors - csv_monitor's files, headers once, DeepSpeed's names", "[monitor]") {
  loom::testing::TempDir dir;
  planner::DeepSpeedConfig config;
  config.csvMonitor = {.enabled = true, .outputPath = dir.path(), .jobName = "run"};
  auto monitors = Monitors::open(config);
  REQUIRE(monitors.isOk());
  REQUIRE(*monitors);
  REQUIRE((*monitors)->write({{"Train/Samples/lr", 0.001, 8}, {"Train/Samples/loss scale", 2.0, 8}}).isOk());
  REQUIRE((*monitors)->write({{"Train/Samples/lr", 0.002, 16}}).isOk());
  CHECK(files::readFile(dir.path() + "/run/Train_Samples_lr.csv").value() == "step,lr\r\n8,0.001\r\n16,0.002\r\n");
  CHECK(files::readFile(dir.path() + "/run/Train_Samples_loss_scale.csv").value() == "step,loss scale\r\n8,2.0\r\n");
  // Reopened (a restarted rank): rows go on under the one header.
  auto again = Monitors::open(config);
  REQUIRE(again.isOk());
  REQUIRE((*again)->write({{"Train/Samples/lr", 0.003, 24}}).isOk());
  CHECK(files::readFile(dir.path() + "/run/Train_Samples_lr.csv").value() ==
        "step,lr\r\n8,0.001\r\n16,0.002\r\n24,0.003\r\n");
}

TEST_CASE("monitors - none enabled opens nothing; an unwritable directory is named", "[monitor]") {
  planner::DeepSpeedConfig config;
  auto none = Monitors::open(config);
  REQUIRE(none.isOk());
  CHECK_FALSE(*none);
  loom::testing::TempDir dir;
  std::ofstream(dir.path() + "/file") << "x";
  config.tensorboard = {.enabled = true, .outputPath = dir.path() + "/file", .jobName = "run"};
  auto refused = Monitors::open(config);
  REQUIRE_FALSE(refused.isOk());
  CHECK(refused.status().message().find(dir.path() + "/file") != std::string::npos);
}

TEST_CASE("mfu terms - PaLM's FLOPs per token, datasheet peaks by device name", "[monitor]") {
  planner::ModelConfig c;
  c.vocabSize = 1000;
  c.hiddenSize = 64;
  c.numLayers = 2;
  c.numHeads = 4;
  c.tieWordEmbeddings = true;
  // 6N + 12 L (heads x head_dim) seq: the tied embedding is the head's matmul, counted once.
  CHECK(trainingFlopsPerToken(c, 100'000, 128) == 6.0 * 100'000 + 12.0 * 2 * 64 * 128);
  c.tieWordEmbeddings = false;  // the input embedding is a lookup
  CHECK(trainingFlopsPerToken(c, 164'000, 128) == 6.0 * 100'000 + 12.0 * 2 * 64 * 128);
  c.numExperts = 8;  // active parameters per token are not counted: no mfu
  CHECK(trainingFlopsPerToken(c, 164'000, 128) == 0);

  CHECK(peakFlopsPerSecond("NVIDIA H200", planner::Precision::kBf16) == Approx(989.4e12));
  CHECK(peakFlopsPerSecond("NVIDIA H100 80GB HBM3", planner::Precision::kFp32) == Approx(66.9e12));
  CHECK(peakFlopsPerSecond("NVIDIA H100 PCIe", planner::Precision::kBf16) == Approx(756e12));
  CHECK(peakFlopsPerSecond("", planner::Precision::kBf16) == 0);  // the CPU
  CHECK(peakFlopsPerSecond("Tesla T4", planner::Precision::kFp16) == 0);
}
