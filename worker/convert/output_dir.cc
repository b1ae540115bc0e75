#include "worker/convert/output_dir.h"

#include <filesystem>
#include <vector>

#include <fmt/format.h>

#include "common/files.h"

namespace loom::worker {

namespace fs = std::filesystem;

namespace {

Status checkOutput(const std::string& output) {
  std::error_code ec;
  if (!fs::exists(output, ec)) return Status::ok();
  if (!fs::is_directory(output, ec) || !fs::is_empty(output, ec))
    return failedPrecondition("convert.output: {} exists and is not an empty directory: nothing is written over",
                              output);
  return Status::ok();
}

}  // namespace

StatusOr<std::unique_ptr<ConvertOutput>> ConvertOutput::begin(const RankContext& ctx, const planner::JobSpec& spec) {
  std::unique_ptr<ConvertOutput> out(new ConvertOutput());
  out->rank_ = ctx.rank;
  out->ranks_ = ctx.worldSize;
  out->wait_ = std::chrono::milliseconds(spec.collectiveTimeoutMs);
  const fs::path output = fs::path(spec.convert.output).lexically_normal();
  const fs::path parent = output.has_parent_path() ? output.parent_path() : fs::path(".");
  out->output_ = output.string();
  out->parent_ = parent.string();
  // A restarted attempt starts over in a directory of its own job's name.
  out->tmp_ = (parent / ("." + output.filename().string() + ".convert-" + ctx.jobId)).string();
  if (ctx.rank == 0) RETURN_IF_ERROR(checkOutput(out->output_));
  if (ctx.worldSize > 1) {
    auto connected = backends::TcpStore::connect({.host = ctx.masterAddr,
                                                  .port = ctx.masterPort,
                                                  .isServer = ctx.rank == 0,
                                                  .connectTimeout = std::chrono::milliseconds(spec.rendezvousTimeoutMs)});
    if (!connected.isOk()) return connected.status().withContext("rendezvous");
    out->store_ = std::move(*connected);
  }
  if (ctx.rank == 0) {
    RETURN_IF_ERROR(files::removeAll(out->tmp_));
    RETURN_IF_ERROR(files::makeDirs(out->tmp_));
    if (out->store_) RETURN_IF_ERROR(out->store_->set("convert/ready", "1"));
  } else {
    RETURN_IF_ERROR(out->store_->get({"convert/ready"}, out->wait_).status().withContext("waiting for rank 0's directory"));
  }
  return out;
}

Status ConvertOutput::finish(const std::function<Status(const std::string& dir)>& complete) {
  if (rank_ != 0) {
    RETURN_IF_ERROR(store_->set(fmt::format("convert/done/{}", rank_), "1"));
    // The job succeeds once the output is published; rank 0 serves the store until every rank
    // has seen it.
    RETURN_IF_ERROR(store_->get({"convert/published"}, wait_).status().withContext("waiting for rank 0 to publish"));
    return store_->set(fmt::format("convert/seen/{}", rank_), "1");
  }
  std::vector<std::string> others;
  for (int r = 1; r < ranks_; ++r) others.push_back(fmt::format("convert/done/{}", r));
  if (!others.empty())
    RETURN_IF_ERROR(store_->get(others, wait_).status().withContext("waiting for the other ranks' files"));
  RETURN_IF_ERROR(complete(tmp_).withContext("convert.output"));
  RETURN_IF_ERROR(files::syncDirectory(tmp_));
  std::error_code ec;
  if (fs::exists(output_, ec)) fs::remove(output_, ec);  // the empty directory checkOutput allowed
  fs::rename(tmp_, output_, ec);
  if (ec) return internalError("convert.output: cannot rename {} to {}: {}", tmp_, output_, ec.message());
  RETURN_IF_ERROR(files::syncDirectory(parent_));
  if (!store_) return Status::ok();
  RETURN_IF_ERROR(store_->set("convert/published", "1"));
  std::vector<std::string> seen;
  for (int r = 1; r < ranks_; ++r) seen.push_back(fmt::format("convert/seen/{}", r));
  return store_->get(seen, wait_).status().withContext("waiting for the other ranks to finish");
}

}  // namespace loom::worker
