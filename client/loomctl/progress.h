#pragma once

#include <chrono>
#include <cstdio>

#include "loom/v1/job.pb.h"

namespace loom::loomctl {

// Shows a job's updates as they arrive: every state change with its reason on its own line, and
// a progress line (bar, step, latest metrics) redrawn in place on a terminal or printed at most
// once a second elsewhere.
class ProgressPrinter {
 public:
  explicit ProgressPrinter(std::FILE* out);
  void onUpdate(const v1::JobUpdate& update);
  // Ends the progress line.
  void finish();

 private:
  void drawProgress(const v1::Job& job);

  std::FILE* out_;
  bool tty_;
  bool lineOpen_ = false;
  std::chrono::steady_clock::time_point lastDraw_{};
};

}  // namespace loom::loomctl
