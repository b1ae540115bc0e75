#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "planner/deepspeed_config.h"
#include "planner/model_config.h"
#include "planner/model_parameters.h"
#include "planner/tensor_parallel.h"

namespace loom::planner {

struct TrainingShape {
  int zeroStage = 0;
  int dataParallel = 1;            // the dense-data group: dp x sp
  int expertParallel = 1;          // ep: a rank holds 1/ep of the experts, data-parallel over dataParallel / ep
  int tensorParallel = 1;
  int sequenceParallel = 1;
  Precision precision = Precision::kBf16;
  double optimizerStates = 2;  // fp32 tensors per trainable element (optimizerStatesPerElement)
  bool offloadOptimizer = false;   // offload_optimizer.device cpu: master weights and states on the host
  bool offloadParameters = false;  // offload_param.device cpu (stage 3): the parameters' parts on the host
  bool training = true;            // false (eval): no gradients nor optimizer state
  int64_t microBatch = 1;
  int64_t sequenceLength = 2048;
  int64_t reduceBucketElements = 500'000'000;        // reduce_bucket_size
  int64_t persistenceThreshold = 100'000;            // stage3_param_persistence_threshold
  int64_t prefetchBucketElements = 50'000'000;       // stage3_prefetch_bucket_size
  // Activation checkpointing: how many decoder layers keep only their input (0: none), and
  // whether those inputs wait in host memory (cpu_checkpointing).
  int64_t checkpointedLayers = 0;
  bool checkpointsOnHost = false;
};

// Bytes on one rank's device, by what holds them.
struct MemoryEstimate {
  int64_t parameters = 0;
  int64_t gradients = 0;
  int64_t optimizer = 0;      // fp32 master weights and optimizer states (0 when offloaded)
  int64_t activations = 0;
  int64_t hostOptimizer = 0;  // on the host instead, when offloaded
  int64_t hostParameters = 0; // stage 3's parameter parts on the host instead (offload_param)
  int64_t total() const { return parameters + gradients + optimizer + activations; }
  // "optimizer state (12.0 GiB)": the largest device term, named.
  std::string largestTerm() const;
};

// Mixed precision keeps 2-byte weights and gradients plus an fp32 master copy and the optimizer's
// fp32 states (the 16 bytes per parameter of ZeRO's paper with Adam); fp32 training keeps 4-byte
// weights and gradients and the states. ZeRO divides the optimizer terms by the data-parallel
// group from stage 1, gradients from stage 2 (plus one reduce bucket), weights from stage 3 (plus
// persistent small parameters and the prefetch bucket; with offload_param the parts are on the host
// and only the persistent ones and the gathered blocks on the device). A rank holds the tensor-parallel shapes
// of `layouts`, and of the experts only its 1/ep, whose ZeRO group is the expert-data-parallel
// one (dataParallel / ep). Buffers (not trainable) count as weights only. Activations follow Korthikanti et al.
// with memory-efficient attention and no recomputation: 10 + 24/tp bytes per hidden unit per
// token per layer, with the sequence split by sp, plus the head's logits in fp32 (4 bytes per
// vocabulary entry of the rank's tp slice per token, twice: values and gradient). A checkpointed
// layer keeps its input (in the model's dtype) instead (none on the device with cpu_checkpointing), and one
// layer's whole activations exist at a time while it is recomputed.
MemoryEstimate estimateMemory(const ModelConfig& config, const std::vector<ParameterInfo>& parameters,
                              const std::vector<TpLayout>& layouts, const TrainingShape& shape);

// InvalidArgument when the estimate is above `deviceBytes`, saying by how much and which term
// dominates: the spec must change (more ranks, a higher ZeRO stage, offloading, a smaller batch).
Status checkFits(const MemoryEstimate& estimate, int64_t deviceBytes);

}  // namespace loom::planner
