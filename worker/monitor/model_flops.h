#pragma once

#include <string_view>

#include "planner/deepspeed_config.h"
#include "planner/model_config.h"

// Model FLOPs utilization (the `mfu` metric): the FLOPs a dense decoder's training needs per
// token against what the device can do.
namespace loom::worker {

// PaLM's count (appendix B; nanoGPT's estimate_mfu): 6N + 12·L·(heads·head_dim)·seq per trained
// token, N the parameters that multiply (all but an untied input embedding, a lookup), causal
// attention counted whole. 0 for a mixture-of-experts or latent-attention model, whose active
// parameters per token this does not count.
double trainingFlopsPerToken(const planner::ModelConfig& config, int64_t parameters, int64_t seqLen);

// The dense peak FLOP/s of one device for the precision's matrix multiplies (bf16 and fp16 on
// tensor cores; fp32 without TF32, libtorch's default), from the datasheets of the GPUs named
// here by their CUDA device name; 0 for any other device, the CPU included: no MFU is reported.
double peakFlopsPerSecond(std::string_view deviceName, planner::Precision precision);

}  // namespace loom::worker
