#pragma once

#include <functional>
#include <memory>
#include <string>

#include "backends/rendezvous/tcp_store.h"
#include "common/status.h"
#include "planner/job_spec.h"
#include "worker/rank_context.h"

namespace loom::worker {

// Where a convert job writes, on every rank: a temporary directory beside convert.output
// (.<name>.convert-<job id>), renamed into place by rank 0 once every rank has written its part,
// so that the output appears whole or not at all. An output that exists and is not an empty
// directory is refused, untouched. Several ranks (their output on storage they share) meet in the
// attempt's store: rank 0 makes the directory and publishes, the others wait for each.
class ConvertOutput {
 public:
  static StatusOr<std::unique_ptr<ConvertOutput>> begin(const RankContext& ctx, const planner::JobSpec& spec);

  // The temporary directory every rank writes its files into.
  const std::string& dir() const { return tmp_; }
  const std::string& output() const { return output_; }

  // Once this rank's files are written (each fsynced): rank 0 waits for the others', runs
  // `complete` on the directory (what is written once every part is there: an index, a
  // manifest), fsyncs and renames it into place, and serves the store until every rank has seen
  // that; the others say they are done and wait for it.
  Status finish(const std::function<Status(const std::string& dir)>& complete);

 private:
  ConvertOutput() = default;

  int rank_ = 0, ranks_ = 1;
  std::string tmp_, output_, parent_;
  std::chrono::milliseconds wait_{0};
  std::unique_ptr<backends::TcpStore> store_;
};

}  // namespace loom::worker
