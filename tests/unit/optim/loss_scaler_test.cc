#include "worker/optim/loss_scaler.h"

#include "tests/catch.h"

using loom::planner::DeepSpeedConfig;
using loom::planner::Precision;
using loom::train::LossScaler;

namespace {

DeepSpeedConfig fp16(int hysteresis, int64_t window) {
  DeepSpeedConfig c;
  c.precision = Precision::kFp16;
  c.lossScale.initialScalePower = 4;
  c.lossScale.hysteresis = hysteresis;
  c.lossScale.window = window;
  c.lossScale.minScale = 2;
  return c;
}

}  // namespace

TEST_CASE("loss scaler: hysteresis delays the halving, a window of good steps doubles", "[train]") {
  LossScaler s(fp16(/*hysteresis=*/2, /*window=*/3));
  CHECK(s.scale() == 16);
  REQUIRE(s.update(true).isOk());  // first overflow spends the hysteresis
  CHECK(s.scale() == 16);
  REQUIRE(s.update(true).isOk());  // second one halves
  CHECK(s.scale() == 8);
  REQUIRE(s.update(false).isOk());
  REQUIRE(s.update(false).isOk());
  CHECK(s.scale() == 8);
  REQUIRE(s.update(false).isOk());  // three good steps since the last overflow
  CHECK(s.scale() == 16);
}

TEST_CASE("loss scaler: never below min_loss_scale, and an overflow there is an error", "[train]") {
  LossScaler s(fp16(1, 1000));
  REQUIRE(s.update(true).isOk());
  REQUIRE(s.update(true).isOk());
  REQUIRE(s.update(true).isOk());
  CHECK(s.scale() == 2);
  auto stuck = s.update(true);
  REQUIRE_FALSE(stuck.isOk());
  CHECK(stuck.message().find("gradients overflow at the minimum loss scale 2") != std::string::npos);
}

TEST_CASE("loss scaler: state round-trips; static scales and non-fp16 never move", "[train]") {
  LossScaler a(fp16(2, 3));
  REQUIRE(a.update(true).isOk());
  LossScaler b(fp16(2, 3));
  REQUIRE(b.restore(a.state()).isOk());
  REQUIRE(b.update(true).isOk());
  CHECK(b.scale() == 8);

  auto fixed = fp16(2, 3);
  fixed.lossScale.staticScale = 128;
  LossScaler s(fixed);
  REQUIRE(s.update(true).isOk());
  CHECK(s.scale() == 128);
  CHECK(LossScaler(DeepSpeedConfig{}).scale() == 1);
}
