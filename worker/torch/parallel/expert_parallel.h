#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include <ATen/core/Tensor.h>

#include "backends/communicator.h"
#include "worker/torch/model/moe.h"

namespace loom::worker {

// Expert parallelism (DeepSpeed's AutoEP): the E experts of each MoE layer are split over the
// ep ranks of the expert-parallel group, rank r holding experts r*E/ep to (r+1)*E/ep - 1 (the
// Plan's expertOwner). Dropless dispatch: every token reaches every expert it chose, however
// uneven the load.
class ExpertParallel {
 public:
  ExpertParallel(std::shared_ptr<backends::Communicator> group, int64_t numExperts);

  // rows [R, H] grouped by expert (counts[e] rows for expert e, all E of them, in order) -> the
  // experts' MLP outputs (as `mlp` says) for the same rows, in the same order. One all-to-all of the per-expert
  // counts, an all-to-all-v of the rows to their experts' owners, the local experts over what
  // arrived (regrouped by expert), and an all-to-all-v of the outputs back. The backward runs the
  // same exchanges the other way; a rank that received no rows still takes part. `arrived`, when
  // not null and not empty, is the rows each rank sends each local expert as an earlier run
  // counted them (a replay, RoutingRecord): the count exchange is skipped; when empty, it is
  // filled.
  at::Tensor run(const at::Tensor& rows, const std::vector<int64_t>& counts, const MoeWeights& w, LinearFn linear,
                 const planner::ExpertMlpConfig& mlp, std::vector<int64_t>* arrived = nullptr);

 private:
  std::shared_ptr<backends::Communicator> group_;
  int64_t numExperts_, localExperts_;
};

}  // namespace loom::worker
