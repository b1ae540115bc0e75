// loomctl generate and loomctl rollout: a served rollout's RolloutService, through the planner.
#include <cstdio>

#include <nlohmann/json.hpp>

#include "client/loom_client.h"
#include "client/loomctl/commands.h"
#include "client/loomctl/output.h"
#include "client/loomctl/rollout_requests.h"

namespace loom::loomctl {

namespace {

void printStatus(const v1::RolloutStatus& s) {
  std::printf("weights version %lld%s%s; %s: %lld running, %lld waiting; KV blocks %lld of %lld used; "
              "%lld preemptions; %lld requests served, %lld output tokens\n",
              static_cast<long long>(s.weights_version()), s.weights_source().empty() ? "" : " from ",
              s.weights_source().c_str(), s.paused() ? "paused" : "serving",
              static_cast<long long>(s.requests_running()), static_cast<long long>(s.requests_waiting()),
              static_cast<long long>(s.kv_blocks_used()), static_cast<long long>(s.kv_blocks_total()),
              static_cast<long long>(s.preemptions()), static_cast<long long>(s.requests_served()),
              static_cast<long long>(s.output_tokens()));
  if (s.updates_pending() > 0)
    std::printf("%lld weight update(s) waiting for the requests in flight to finish\n",
                static_cast<long long>(s.updates_pending()));
}

int reportStatus(const GlobalOptions& g, const StatusOr<v1::RolloutStatus>& status) {
  if (!status.isOk()) return reportError(status.status());
  if (g.format == OutputFormat::kJson) {
    std::printf("%s\n", toJson(*status).c_str());
  } else {
    printStatus(*status);
  }
  return 0;
}

int generateFromFile(const GlobalOptions& g, client::LoomClient& client, const GenerateOptions& o) {
  auto prompts = readPromptRequests(o.file, o.samplingJson);
  if (!prompts.isOk()) return reportError(prompts.status());
  v1::GenerateBatchRequest batch;
  batch.set_job_id(o.jobId);
  for (const PromptRequest& p : *prompts) *batch.add_prompts() = p.request;
  auto response = retryWhileUnavailable(o.waitS, [&] { return client.generateBatch(batch); });
  if (!response.isOk()) return reportError(response.status());
  // One JSON line per sample, as a rollout's results file.
  for (const v1::SampleResult& r : response->results()) {
    nlohmann::json out = nlohmann::json::parse(toJsonLine(r));
    out.erase("prompt_index");
    out["id"] = (*prompts)[static_cast<size_t>(r.prompt_index())].id;
    std::printf("%s\n", out.dump().c_str());
  }
  return 0;
}

}  // namespace

int generateCommand(const GlobalOptions& g, const GenerateOptions& o) {
  client::LoomClient client(g.server, g.credentials);
  if (!o.file.empty()) return generateFromFile(g, client, o);
  v1::GenerateRequest request;
  request.set_job_id(o.jobId);
  request.set_prompt(o.prompt);
  for (int64_t id : o.tokenIds) request.add_prompt_token_ids(id);
  request.set_sampling_json(o.samplingJson);
  // Text as it comes (token ids when the job has no tokenizer); the finish of each sample on stderr.
  bool printedText = false;
  auto status = retryWhileUnavailable(o.waitS, [&] {
    return client.generate(request, [&](const v1::GenerateResponse& r) {
      if (g.format == OutputFormat::kJson) {
        std::printf("%s\n", toJsonLine(r).c_str());
      } else {
        for (const v1::SampleDelta& d : r.samples()) {
          if (!d.text().empty()) {
            std::fputs(d.text().c_str(), stdout);
            printedText = true;
          } else if (!printedText) {
            for (int64_t t : d.token_ids()) std::printf("%lld ", static_cast<long long>(t));
          }
          if (!d.finish_reason().empty())
            std::fprintf(stderr, "\n[sample %d: %s, weights version %lld]\n", d.sample(), d.finish_reason().c_str(),
                         static_cast<long long>(r.weights_version()));
        }
      }
      std::fflush(stdout);
      return true;
    });
  });
  if (!status.isOk()) return reportError(status);
  return 0;
}

int rolloutReloadCommand(const GlobalOptions& g, const ReloadOptions& o) {
  client::LoomClient client(g.server, g.credentials);
  v1::UpdateWeightsRequest request;
  request.set_job_id(o.jobId);
  request.set_checkpoint_dir(o.dir);
  request.set_from_job_id(o.fromJob);
  request.set_in_flight(o.abortInFlight ? v1::IN_FLIGHT_ABORT : v1::IN_FLIGHT_FINISH);
  request.set_version(o.version);
  return reportStatus(g, client.updateWeights(request));
}

int rolloutControlCommand(const GlobalOptions& g, const std::string& action, const std::string& jobId, double waitS) {
  client::LoomClient client(g.server, g.credentials);
  if (action == "pause") return reportStatus(g, client.pauseRollout(jobId));
  if (action == "resume") return reportStatus(g, client.resumeRollout(jobId));
  return reportStatus(g, retryWhileUnavailable(waitS, [&] { return client.rolloutStatus(jobId); }));
}

}  // namespace loom::loomctl
