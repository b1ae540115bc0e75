#include "client/loomctl/commands.h"

#include <filesystem>
#include <map>
#include <string_view>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "client/loom_client.h"
#include "client/loomctl/progress.h"
#include "common/files.h"
#include "planner/deepspeed_config.h"
#include "planner/job_plan.h"
#include "planner/job_spec.h"
#include "planner/plan_compiler.h"

namespace loom::loomctl {

// PATH=VALUE into `root`: objects along the path are created; VALUE is JSON when it parses (1e-4,
// true, [0.9, 0.95], {"device": "cpu"}), else the string itself (AdamW).
Status applySet(nlohmann::json& root, const std::string& assignment) {
  const size_t eq = assignment.find('=');
  if (eq == std::string::npos || eq == 0)
    return invalidArgument("--set {}: give PATH=VALUE (e.g. deepspeed.optimizer.params.lr=1e-4)", assignment);
  const std::string path = assignment.substr(0, eq), text = assignment.substr(eq + 1);
  nlohmann::json value = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (value.is_discarded()) value = text;
  nlohmann::json* at = &root;
  size_t begin = 0;
  for (;;) {
    const size_t dot = path.find('.', begin);
    const std::string key = path.substr(begin, dot == std::string::npos ? std::string::npos : dot - begin);
    if (key.empty()) return invalidArgument("--set {}: {} has an empty key", assignment, path);
    if (!at->is_object())
      return invalidArgument("--set {}: {} is a JSON {} in the spec, not an object", assignment,
                             path.substr(0, begin - 1), at->type_name());
    if (dot == std::string::npos) {
      (*at)[key] = std::move(value);
      return Status::ok();
    }
    if (!at->contains(key)) (*at)[key] = nlohmann::json::object();
    at = &(*at)[key];
    begin = dot + 1;
  }
}

StatusOr<std::string> readSpecFile(const std::string& path, const SpecOverrides& overrides) {
  std::string text;
  std::string dir = std::filesystem::current_path().string();
  if (path == "-") {
    text.assign(std::istreambuf_iterator<char>(std::cin), {});
  } else {
    auto read = files::readFile(path);
    if (!read.isOk()) return Status(StatusCode::kInvalidArgument, read.status().message());
    text = std::move(read).value();
    // Paths in a spec are relative to the spec file, wherever loomctl runs.
    dir = std::filesystem::absolute(path).parent_path().string();
  }
  text = planner::resolveSpecPaths(text, dir);
  if (overrides.deepspeedFile.empty() && overrides.sets.empty()) return planner::inlineDeepSpeedFile(text);
  nlohmann::json root = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!root.is_object()) return planner::inlineDeepSpeedFile(text);  // the parser says what is wrong with it
  // A file named on the command line is relative to where loomctl runs.
  if (!overrides.deepspeedFile.empty()) root["deepspeed"] = std::filesystem::absolute(overrides.deepspeedFile).string();
  ASSIGN_OR_RETURN(std::string inlined, planner::inlineDeepSpeedFile(root.dump()));
  root = nlohmann::json::parse(inlined);
  for (const std::string& set : overrides.sets) RETURN_IF_ERROR(applySet(root, set));
  return root.dump(2);
}

namespace {

int printJob(const GlobalOptions& g, const v1::Job& job) {
  std::fputs((g.format == OutputFormat::kJson ? toJson(job) + "\n" : describeJob(job)).c_str(), stdout);
  return 0;
}

// Follows the job to its end, showing progress; returns the job's exit code.
int followJob(const GlobalOptions& g, client::LoomClient& client, const std::string& jobId) {
  ProgressPrinter printer(stderr);
  v1::Job last;
  Status s = client.watchJob(jobId, [&](const v1::JobUpdate& update) {
    last = update.job();
    if (g.format == OutputFormat::kJson) {  // JSON Lines: one update per line
      std::fputs((toJsonLine(update) + "\n").c_str(), stdout);
      std::fflush(stdout);
    } else {
      printer.onUpdate(update);
    }
    return true;
  });
  printer.finish();
  if (!s.isOk()) return reportError(s);
  return exitCodeFor(last.state());
}

}  // namespace

int submitCommand(const GlobalOptions& g, const std::string& file, const std::string& requestId, bool wait) {
  auto spec = readSpecFile(file, g.overrides);
  if (!spec.isOk()) return reportError(spec.status());
  client::LoomClient client(g.server, g.credentials);
  auto created = client.createJob(*spec, requestId);
  if (!created.isOk()) return reportError(created.status().withContext(file));
  const v1::Job& job = created->job();
  if (g.format == OutputFormat::kJson && !wait) {
    std::puts(toJson(*created).c_str());
  } else {
    std::puts(job.id().c_str());  // alone on stdout, for scripts: id=$(loomctl submit job.json)
  }
  std::fflush(stdout);
  if (!wait) return 0;
  auto final = client.awaitJob(job.id(), std::chrono::milliseconds::zero());
  if (!final.isOk()) return reportError(final.status());
  std::fprintf(stderr, "%s: %s\n", client::stateName(final->state()).c_str(), final->reason().c_str());
  return exitCodeFor(final->state());
}

int getCommand(const GlobalOptions& g, const std::string& jobId) {
  client::LoomClient client(g.server, g.credentials);
  auto job = client.getJob(jobId);
  if (!job.isOk()) return reportError(job.status());
  return printJob(g, *job);
}

int listCommand(const GlobalOptions& g, const std::vector<std::string>& states, int limit) {
  client::LoomClient client(g.server, g.credentials);
  v1::ListJobsRequest request;
  // The table shows no spec; -o json prints each job whole, as `get` does.
  request.set_view(g.format == OutputFormat::kJson ? v1::JOB_VIEW_FULL : v1::JOB_VIEW_BASIC);
  for (const auto& s : states) {
    v1::JobState state;
    std::string upper;
    for (char c : s) upper += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    if (!v1::JobState_Parse(upper, &state) || state == v1::JOB_STATE_UNSPECIFIED)
      return reportError(invalidArgument("--state: unknown state \"{}\"", s));
    request.add_states(state);
  }
  v1::ListJobsResponse all;
  do {
    request.set_page_size(std::min(limit - all.jobs_size(), 1000));
    auto page = client.listJobs(request);
    if (!page.isOk()) return reportError(page.status());
    for (const auto& job : page->jobs()) *all.add_jobs() = job;
    request.set_page_token(page->next_page_token());
  } while (!request.page_token().empty() && all.jobs_size() < limit);
  if (g.format == OutputFormat::kJson) {
    std::puts(toJson(all).c_str());
    return 0;
  }
  std::fputs(jobTableHeader().c_str(), stdout);
  for (const auto& job : all.jobs()) std::fputs(jobTableRow(job).c_str(), stdout);
  return 0;
}

int watchCommand(const GlobalOptions& g, const std::string& jobId) {
  client::LoomClient client(g.server, g.credentials);
  return followJob(g, client, jobId);
}

int logsCommand(const GlobalOptions& g, const std::string& jobId, const std::vector<int>& ranks, bool follow,
                int tail, int attempt) {
  client::LoomClient client(g.server, g.credentials);
  v1::GetJobLogsRequest request;
  request.set_job_id(jobId);
  for (int r : ranks) request.add_ranks(r);
  request.set_follow(follow);
  request.set_tail_lines(tail);
  request.set_attempt(attempt);
  // Whole lines only: a partial line waits for its end. With several ranks each line names its
  // rank ("[rank 1] ..."); -o json prints JSON Lines ({"rank", "attempt", "line"}).
  const bool json = g.format == OutputFormat::kJson;
  const bool prefix = ranks.size() != 1;
  auto printLine = [&](int rank, int attempt, std::string_view line) {
    if (json) {
      std::puts(nlohmann::json{{"rank", rank}, {"attempt", attempt}, {"line", line}}
                    .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)
                    .c_str());
    } else if (prefix) {
      std::fprintf(stdout, "[rank %d] %.*s\n", rank, static_cast<int>(line.size()), line.data());
    } else {
      std::fwrite(line.data(), 1, line.size(), stdout);
      std::fputc('\n', stdout);
    }
  };
  std::map<int, std::pair<int, std::string>> partial;  // rank -> (attempt, the unfinished line)
  Status s = client.streamLogs(request, [&](const v1::LogChunk& chunk) {
    auto& [chunkAttempt, buf] = partial[chunk.rank()];
    chunkAttempt = chunk.attempt();
    buf += chunk.data();
    size_t start = 0, nl;
    while ((nl = buf.find('\n', start)) != std::string::npos) {
      printLine(chunk.rank(), chunk.attempt(), std::string_view(buf).substr(start, nl - start));
      start = nl + 1;
    }
    buf.erase(0, start);
    std::fflush(stdout);
    return true;
  });
  for (const auto& [rank, rest] : partial) {
    if (!rest.second.empty()) printLine(rank, rest.first, rest.second);
  }
  if (!s.isOk()) return reportError(s);
  return 0;
}

int cancelCommand(const GlobalOptions& g, const std::string& jobId, const std::string& reason) {
  client::LoomClient client(g.server, g.credentials);
  auto job = client.cancelJob(jobId, reason);
  if (!job.isOk()) return reportError(job.status());
  if (g.format == OutputFormat::kJson) return printJob(g, *job);
  std::printf("%s: %s\n", client::stateName(job->state()).c_str(), job->reason().c_str());
  return 0;
}

int waitCommand(const GlobalOptions& g, const std::string& jobId, double timeoutS) {
  client::LoomClient client(g.server, g.credentials);
  auto job = client.awaitJob(jobId, std::chrono::milliseconds(static_cast<int64_t>(timeoutS * 1000)));
  if (!job.isOk()) return reportError(job.status());
  if (g.format == OutputFormat::kJson) {
    printJob(g, *job);
  } else {
    std::printf("%s: %s\n", client::stateName(job->state()).c_str(), job->reason().c_str());
  }
  return job->state() == v1::SUCCEEDED ? 0 : exitCodeFor(job->state());
}

// Checked here, with the same code the planner runs, so no server is needed.
int validateCommand(const GlobalOptions& g, const std::string& file) {
  auto text = readSpecFile(file, g.overrides);
  if (!text.isOk()) return reportError(text.status());
  auto spec = planner::parseJobSpec(*text);
  if (!spec.isOk()) return reportError(spec.status().withContext(file));
  // A train or eval job must also compile, as on submit.
  if (planner::checkHasPlan(*spec).isOk()) {
    auto plan = planner::compileJobPlan(*spec);
    if (!plan.isOk()) return reportError(plan.status().withContext(file));
  }
  if (g.format == OutputFormat::kJson) {
    std::puts(spec->toJson().dump(2).c_str());
  } else {
    std::printf("%s: valid %s job, %d rank%s\n", file.c_str(), planner::jobKindName(spec->kind), spec->ranks,
                spec->ranks == 1 ? "" : "s");
  }
  return 0;
}

}  // namespace loom::loomctl
