#include "worker/torch/zero/zero_optimizer.h"

#include "worker/torch/zero/zero_stage0.h"
#include "worker/torch/zero/zero_stage12.h"
#include "worker/torch/zero/zero_stage3.h"

namespace loom::worker {

std::unique_ptr<ZeroEngine> makeZeroEngine(const planner::DeepSpeedConfig& config, const planner::Plan& plan,
                                           DecoderModel& model, backends::Communicator* comm) {
  switch (config.zero.stage) {
    case 0: return makeZeroStage0(config, model, comm);
    case 1:
    case 2: return makeZeroStage12(config, plan.zero, model, comm);
    default: return makeZeroStage3(config, plan, model, comm);
  }
}

}  // namespace loom::worker
