#pragma once

#include <string>
#include <vector>

#include "common/status.h"
#include "worker/checkpoint/state_layout.h"
#include "worker/convert/convert_progress.h"
#include "worker/convert/convert_writer.h"
#include "worker/convert/layout_plan.h"
#include "worker/convert/checkpoint_source.h"

namespace loom::worker {

// A Loom checkpoint of `source` (a Loom checkpoint of another layout, or a DeepSpeed one) for the
// layout `target` (convert.layout), resumable as if it had been written there: <dir>/<tag>/ with
// the model's files as they are when the source is Loom's (they do not depend on the layout), or
// written from its tensors in the model's dtype; config.json; trainer_state.json saying the new
// layout; every rank's optimizer state in the target's state layout (checkpoint/state_layout.h);
// then `latest`.
//
// Each piece of state is copied once, from where the source keeps those elements to where the
// target does: the two layouts map their pieces to the whole parameter, so a target piece is read
// run by run from the source's files into a chunk of at most 16 MiB and written, and no
// parameter is ever assembled whole. A rank's RNG state goes to the same rank (rank r % the
// source's ranks where the target has more). The files are split over the convert job's ranks
// (file i by rank i % ranks).
class LoomWriter : public ConvertWriter {
 public:
  LoomWriter(const convert::ResumableCheckpoint& source, convert::LayoutPlan target);
  // The target's state layout, checked: InvalidArgument naming what the two layouts disagree on.
  Status prepare();
  int64_t totalBytes() const override;
  int64_t shareBytes(int rank, int ranks) const override;
  size_t fileCount() const override { return outputs_.size() + 1; }
  // The largest state tensor (or model tensor, when the model is written here): what a copy
  // through chunks never holds whole.
  int64_t largestTensorBytes() const override { return largest_; }

  Status writeShare(const std::string& dir, int rank, int ranks, ConvertProgress& progress) override;
  // Rank 0, once every file is there: the manifest and `latest`.
  Status complete(const std::string& dir) const override;

 private:
  struct Output {
    std::string name;  // relative to the tag directory
    int64_t bytes = 0;
    const checkpoint::StateFile* state = nullptr;  // a state file of the target layout
    int rank = -1;                                 // a rank file's world rank
    bool model = false;                            // the model, written from the source's tensors
  };
  Status writeOutput(const std::string& tagDir, const Output& out, ConvertProgress& progress);
  Status writeStateFile(const std::string& path, const Output& out, ConvertProgress& progress);
  std::string trainerStateText() const;

  const convert::ResumableCheckpoint& source_;
  convert::LayoutPlan target_;
  checkpoint::StateLayout layout_;
  std::vector<Output> outputs_;
  int64_t largest_ = 0;
};

}  // namespace loom::worker
