// loomctl rl: RL post-training as a loop of jobs on one control plane. Each iteration draws samples
// from a served rollout job, scores them, trains on them in a train job, and loads the new weights
// into the rollout job, which stays up throughout (docs/post-training.md).
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "client/loom_client.h"
#include "client/loomctl/commands.h"
#include "client/loomctl/output.h"
#include "client/loomctl/rollout_requests.h"
#include "common/files.h"
#include "common/process.h"
#include "planner/json_reader.h"
#include "planner/post_training_spec.h"
#include "worker/rollout/response_samples.h"
#include "worker/rollout/results_file.h"

namespace loom::loomctl {

namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;
namespace fs = std::filesystem;

double since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

// The loop file (loomctl rl LOOP.json); its relative paths are relative to it.
struct Loop {
  std::string name = "rl";
  std::string rolloutJob;
  std::string prompts;
  std::string train;  // a train job spec: the template of each iteration's job
  int64_t iterations = 0;
  std::string workDir;
  std::vector<std::string> scorer;  // a command run here as: scorer... RESULTS SCORES
  bool abortInFlight = false;
  double waitS = 300;
  std::string samplingJson;  // over the rollout job's rollout.sampling, for prompts without their own
};

StatusOr<Loop> readLoop(const std::string& path) {
  ASSIGN_OR_RETURN(const std::string text, files::readFile(path));
  const json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return invalidArgument("{}: not a JSON object", path);
  planner::ObjectReader r(j, "");
  Loop loop;
  RETURN_IF_ERROR(r.readString("name", &loop.name, false));
  RETURN_IF_ERROR(r.readString("rollout_job", &loop.rolloutJob, true));
  RETURN_IF_ERROR(r.readString("prompts", &loop.prompts, true));
  RETURN_IF_ERROR(r.readString("train", &loop.train, true));
  RETURN_IF_ERROR(r.readInt("iterations", &loop.iterations, true, 1, 1'000'000));
  RETURN_IF_ERROR(r.readString("work_dir", &loop.workDir, false));
  RETURN_IF_ERROR(r.readStrings("scorer", &loop.scorer, {}));
  std::string inFlight = "finish";
  RETURN_IF_ERROR(r.readString("in_flight", &inFlight, false));
  if (inFlight != "finish" && inFlight != "abort")
    return invalidArgument("in_flight: \"{}\" is not finish or abort", inFlight);
  loop.abortInFlight = inFlight == "abort";
  RETURN_IF_ERROR(r.readDouble("wait_s", &loop.waitS, false, 0, 86400));
  if (const json* sampling = r.find("sampling")) {
    if (!sampling->is_object()) return invalidArgument("sampling: must be an object of vLLM SamplingParams keys");
    loop.samplingJson = sampling->dump();
  }
  RETURN_IF_ERROR(r.rejectUnknown());
  const fs::path dir = fs::absolute(path).parent_path();
  auto resolve = [&](std::string& p) {
    if (!p.empty() && p[0] != '/') p = (dir / p).lexically_normal().string();
  };
  if (loop.workDir.empty()) loop.workDir = loop.name;
  resolve(loop.prompts);
  resolve(loop.train);
  resolve(loop.workDir);
  return loop;
}

// The scorer's program, looked up in PATH unless it names a file.
StatusOr<std::string> findProgram(const std::string& name) {
  if (name.find('/') != std::string::npos) return fs::absolute(name).string();
  const char* path = std::getenv("PATH");
  std::stringstream dirs(path ? path : "");
  for (std::string dir; std::getline(dirs, dir, ':');) {
    const fs::path candidate = fs::path(dir) / name;
    if (::access(candidate.c_str(), X_OK) == 0) return candidate.string();
  }
  return notFound("scorer: {} is not a program in PATH", name);
}

// Runs the user's scorer on this machine, never inside a rank: scorer... RESULTS SCORES.
Status runScorer(const std::vector<std::string>& scorer, const std::string& results, const std::string& scores,
                 const std::string& log) {
  ASSIGN_OR_RETURN(const std::string program, findProgram(scorer[0]));
  std::vector<std::string> args(scorer.begin() + 1, scorer.end());
  args.push_back(results);
  args.push_back(scores);
  ASSIGN_OR_RETURN(const int pid, process::spawn({.executable = program, .args = args, .env = {}, .logPath = log,
                                                  .workingDir = {}, .newSession = false}));
  int status = 0;
  if (::waitpid(pid, &status, 0) < 0) return internalError("scorer: waitpid failed");
  const process::ExitInfo exit = process::decodeWaitStatus(status);
  if (exit.signal != 0 || exit.exitCode != 0)
    return Status(StatusCode::kFailedPrecondition,
                  fmt::format("scorer: {} ended with {}; its output is in {}", scorer[0], process::describeExit(exit), log));
  if (!fs::exists(scores)) return Status(StatusCode::kFailedPrecondition, fmt::format("scorer: wrote no {}", scores));
  return Status::ok();
}

// The rollout's answers as a results file, each sample with its prompt's reference.
Status writeResults(const std::vector<PromptRequest>& prompts, const v1::GenerateBatchResponse& response,
                    const std::string& path, int64_t* version) {
  std::vector<rollout::SampleResult> results;
  for (const v1::SampleResult& r : response.results()) {
    const PromptRequest& p = prompts.at(static_cast<size_t>(r.prompt_index()));
    rollout::SampleResult s;
    s.id = p.id;
    s.order = r.prompt_index();
    s.sample = r.sample();
    s.promptTokenIds.assign(r.prompt_token_ids().begin(), r.prompt_token_ids().end());
    s.tokenIds.assign(r.token_ids().begin(), r.token_ids().end());
    if (!r.text().empty()) s.text = r.text();
    s.logprobs.assign(r.logprobs().begin(), r.logprobs().end());
    s.finishReason = r.finish_reason();
    s.reference = p.reference;
    *version = r.weights_version();
    results.push_back(std::move(s));
  }
  return rollout::writeResultsFile(path, std::move(results));
}

struct Iteration {
  int64_t index = 0;
  int64_t samples = 0;
  int64_t rolloutVersion = 0;  // the weights version that answered
  std::optional<double> meanReward;
  std::string trainJob;
  double loss = 0;
  int64_t loadedVersion = 0;
  double rolloutS = 0, scoreS = 0, trainS = 0, updateS = 0;
};

class LoopRunner {
 public:
  LoopRunner(client::LoomClient& client, Loop loop, json train)
      : client_(client), loop_(std::move(loop)), train_(std::move(train)) {}

  StatusOr<Iteration> run(int64_t index);

 private:
  StatusOr<std::optional<double>> score(const std::string& results, const std::string& dir, json& spec);

  client::LoomClient& client_;
  Loop loop_;
  json train_;
};

StatusOr<std::optional<double>> LoopRunner::score(const std::string& results, const std::string& dir, json& spec) {
  const int64_t seqLen = train_["data"].value("seq_len", int64_t(INT32_MAX));
  ASSIGN_OR_RETURN(std::vector<rollout::ResponseSample> samples,
                   rollout::readResponseSamples(results, INT64_MAX, seqLen));
  if (!loop_.scorer.empty()) {
    const std::string scores = dir + "/scores.jsonl";
    RETURN_IF_ERROR(runScorer(loop_.scorer, results, scores, dir + "/scorer.log"));
    RETURN_IF_ERROR(rollout::applyScoresFile(samples, scores));
    spec["data"]["rewards"] = scores;
    spec["data"].erase("reward");  // the scorer takes the rule's place
  } else if (const json reward = train_["data"].value("reward", json()); !reward.is_null()) {
    ASSIGN_OR_RETURN(const planner::RewardRule rule, planner::parseRewardRule(reward));
    RETURN_IF_ERROR(rollout::applyRewardRule(samples, rule));
  } else {
    return std::optional<double>();
  }
  return std::optional<double>(rollout::meanReward(samples));
}

StatusOr<Iteration> LoopRunner::run(int64_t index) {
  Iteration it{.index = index};
  const std::string dir = fmt::format("{}/iteration-{}", loop_.workDir, index);
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return invalidArgument("work_dir: cannot create {}: {}", dir, ec.message());

  // Rollout: the prompts as one batch to the served job.
  auto started = Clock::now();
  ASSIGN_OR_RETURN(const std::vector<PromptRequest> prompts, readPromptRequests(loop_.prompts, loop_.samplingJson));
  v1::GenerateBatchRequest batch;
  batch.set_job_id(loop_.rolloutJob);
  for (const PromptRequest& p : prompts) *batch.add_prompts() = p.request;
  auto response = retryWhileUnavailable(loop_.waitS, [&] { return client_.generateBatch(batch); });
  if (!response.isOk()) return response.status().withContext(fmt::format("rollout job {}", loop_.rolloutJob));
  const std::string results = dir + "/rollout.jsonl";
  RETURN_IF_ERROR(writeResults(prompts, *response, results, &it.rolloutVersion));
  it.samples = response->results_size();
  it.rolloutS = since(started);

  // Score, then train on the scored samples from the last iteration's checkpoint.
  started = Clock::now();
  json spec = train_;
  ASSIGN_OR_RETURN(it.meanReward, score(results, dir, spec));
  it.scoreS = since(started);
  started = Clock::now();
  spec["name"] = fmt::format("{}-{}", loop_.name, index);
  spec["data"]["train"] = results;
  spec["data"]["format"] = "rollout";
  const int64_t stepsPerIteration = train_["train"].value("steps", int64_t(1));
  spec["train"]["steps"] = stepsPerIteration * index;
  spec["train"]["resume"] = true;
  if (!spec["train"].contains("checkpoint_dir")) spec["train"]["checkpoint_dir"] = loop_.workDir + "/checkpoints";
  ASSIGN_OR_RETURN(const v1::CreateJobResponse created, client_.createJob(spec.dump()));
  it.trainJob = created.job().id();
  ASSIGN_OR_RETURN(const v1::Job trained, client_.awaitJob(it.trainJob, std::chrono::milliseconds(0)));
  if (trained.state() != v1::SUCCEEDED)
    return Status(StatusCode::kAborted, fmt::format("train job {} ({}) {}: {}; see loomctl logs {}", it.trainJob,
                                                    spec["name"].get<std::string>(), client::stateName(trained.state()),
                                                    trained.reason(), it.trainJob));
  if (auto loss = trained.metrics().find("loss"); loss != trained.metrics().end()) it.loss = loss->second;
  it.trainS = since(started);

  // The new weights into the rollout job, which keeps serving.
  started = Clock::now();
  v1::UpdateWeightsRequest update;
  update.set_job_id(loop_.rolloutJob);
  update.set_from_job_id(it.trainJob);
  update.set_in_flight(loop_.abortInFlight ? v1::IN_FLIGHT_ABORT : v1::IN_FLIGHT_FINISH);
  update.set_version(index);
  ASSIGN_OR_RETURN(const v1::RolloutStatus status, client_.updateWeights(update));
  it.loadedVersion = status.weights_version();
  it.updateS = since(started);
  return it;
}

json iterationJson(const Iteration& it) {
  json j{{"iteration", it.index},       {"samples", it.samples},   {"rollout_weights_version", it.rolloutVersion},
         {"train_job", it.trainJob},    {"loss", it.loss},         {"weights_version", it.loadedVersion},
         {"rollout_s", it.rolloutS},    {"score_s", it.scoreS},    {"train_s", it.trainS},
         {"update_weights_s", it.updateS}};
  if (it.meanReward) j["reward_mean"] = *it.meanReward;
  return j;
}

}  // namespace

int rlCommand(const GlobalOptions& g, const std::string& loopFile) {
  auto loop = readLoop(loopFile);
  if (!loop.isOk()) return reportError(loop.status().withContext(loopFile));
  auto trainText = readSpecFile(loop->train);
  if (!trainText.isOk()) return reportError(trainText.status().withContext("train"));
  json train = json::parse(*trainText, nullptr, /*allow_exceptions=*/false);
  if (!train.is_object() || !train.value("data", json()).is_object() || !train.value("train", json()).is_object())
    return reportError(invalidArgument("train: {} must be a train job spec with data and train sections", loop->train));
  client::LoomClient client(g.server, g.credentials);
  const int64_t iterations = loop->iterations;
  LoopRunner runner(client, std::move(*loop), std::move(train));
  for (int64_t i = 1; i <= iterations; ++i) {
    auto it = runner.run(i);
    if (!it.isOk()) return reportError(it.status().withContext(fmt::format("iteration {}", i)));
    if (g.format == OutputFormat::kJson) {
      std::printf("%s\n", iterationJson(*it).dump().c_str());
    } else {
      std::printf("iteration %lld/%lld: %lld samples from weights version %lld%s (%.1f s); train job %s: loss %.4f "
                  "(%.1f s); weights version %lld loaded (%.1f s)\n",
                  static_cast<long long>(i), static_cast<long long>(iterations), static_cast<long long>(it->samples),
                  static_cast<long long>(it->rolloutVersion),
                  it->meanReward ? fmt::format(", mean reward {:.4f}", *it->meanReward).c_str() : "", it->rolloutS,
                  it->trainJob.c_str(), it->loss, it->trainS, static_cast<long long>(it->loadedVersion), it->updateS);
    }
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace loom::loomctl
