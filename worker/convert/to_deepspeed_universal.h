#pragma once

#include <string>
#include <vector>

#include "common/status.h"
#include "planner/deepspeed_config.h"
#include "worker/convert/checkpoint_source.h"
#include "worker/convert/convert_progress.h"
#include "worker/convert/convert_writer.h"

namespace loom::worker {

// A DeepSpeed 0.19.8 universal checkpoint of `source` (a Loom checkpoint of any layout, or a
// DeepSpeed ZeRO one), which a DeepSpeed run with `"checkpoint": {"load_universal": true}` resumes
// on any data-parallel size and ZeRO stage 1, 2 or 3, as it resumes what ds_to_universal.py writes:
//
//   <dir>/latest_universal                         the tag
//   <dir>/<tag>/zero/<parameter>/fp32.pt           {"param": the fp32 master, whole, "cat_dim": 0}
//   <dir>/<tag>/zero/<parameter>/exp_avg.pt        the same for Adam's moments
//   <dir>/<tag>/zero/<parameter>/exp_avg_sq.pt
//   <dir>/<tag>/zero/<parameter>/step.pt           the optimizer's step count, as its state keeps
//                                                  it (a float32 tensor under torch_adam, an int)
//   <dir>/<tag>/zero/optimizer_state.pt            the param group (its lr for the next step,
//                                                  betas, eps, weight_decay), clip_grad,
//                                                  ds_version, and stage 3's state[0].step
//   <dir>/<tag>/mp_rank_00_model_states.pt         where training stood: global_steps,
//   <dir>/<tag>/zero_pp_rank_0_mp_rank_00_model_states.pt   skipped_steps, global_samples, the
//                                                  scheduler's last_batch_iteration, ds_config
//                                                  (both names: stages 1-2 look for the first,
//                                                  3 for the second)
//
// A frozen parameter gets fp32.pt alone (its weight, as ds_to_universal writes it); DeepSpeed
// restores neither it nor buffers from a universal checkpoint: they come from the model it builds.
// Each state streams from the source's ranges through a 16 MiB chunk into its file; no parameter
// is assembled whole. The files are split over the convert job's ranks (file i by rank i % ranks).
// Refused by name: an optimizer other than Adam/AdamW (Muon's momentum and its two param groups,
// Lion's and Adagrad's state are not written yet), and fp16 (its dynamic loss scale).
class UniversalWriter : public ConvertWriter {
 public:
  explicit UniversalWriter(const convert::ResumableCheckpoint& source);
  // The settings the source trained with, checked: InvalidArgument naming what cannot be written.
  Status prepare();
  int64_t totalBytes() const override;
  int64_t shareBytes(int rank, int ranks) const override;
  size_t fileCount() const override { return outputs_.size() + 1; }
  int64_t largestTensorBytes() const override { return largest_; }
  // What the log says was written.
  std::string describe() const;

  Status writeShare(const std::string& dir, int rank, int ranks, ConvertProgress& progress) override;
  // Rank 0, once every file is there: latest_universal.
  Status complete(const std::string& dir) const override;

 private:
  enum class Content { kState, kFrozenWeight, kStep, kOptimizerState, kModelStates };
  struct Output {
    std::string name;  // relative to the tag directory
    Content content = Content::kState;
    const convert::SourceTensor* tensor = nullptr;  // kState, kFrozenWeight, kStep
    std::string state;                              // kState: "master", "exp_avg", "exp_avg_sq"
    int64_t bytes = 0;
  };
  Status writeOutput(const std::string& tagDir, const Output& out, ConvertProgress& progress) const;
  Status writeTensorFile(const std::string& path, const Output& out) const;

  const convert::ResumableCheckpoint& source_;
  planner::DeepSpeedConfig config_;
  std::vector<Output> outputs_;
  int64_t largest_ = 0, parameters_ = 0;
};

}  // namespace loom::worker
