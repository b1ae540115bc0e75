#pragma once

#include <cstdint>

#include "common/process.h"
#include "worker/report_client.h"

namespace loom::worker {

// What a convert rank reports after each tensor: tensors_done, bytes_done, progress (of its own
// share of the bytes) and memory.peak_rss_bytes.
class ConvertProgress {
 public:
  ConvertProgress(ReportClient& reports, int64_t shareBytes) : reports_(reports), shareBytes_(shareBytes) {}

  void tensorDone(int64_t bytes) {
    bytesDone_ += bytes;
    ++tensorsDone_;
    report(shareBytes_ ? static_cast<double>(bytesDone_) / static_cast<double>(shareBytes_) : 1.0);
  }
  void finished() { report(1.0); }

 private:
  void report(double fraction) {
    reports_.progress(tensorsDone_, {{"tensors_done", static_cast<double>(tensorsDone_)},
                                     {"bytes_done", static_cast<double>(bytesDone_)},
                                     {"progress", fraction},
                                     {"memory.peak_rss_bytes", static_cast<double>(process::peakResidentBytes())}});
  }

  ReportClient& reports_;
  int64_t shareBytes_ = 0, bytesDone_ = 0, tensorsDone_ = 0;
};

}  // namespace loom::worker
