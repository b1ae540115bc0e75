// loomctl: Loom's command line. Every command is one or a few public gRPC calls; `run` starts an
// embedded control plane for one job on this machine.
#include <cstdio>
#include <cstdlib>

#include <CLI/CLI.hpp>

#include "client/loomctl/commands.h"
#include "common/security/credential_flags.h"
#include "common/version.h"

int main(int argc, char** argv) {
  using namespace loom::loomctl;
  CLI::App app{"loomctl: run and manage Loom jobs"};
  app.set_version_flag("--version", std::string("loomctl ") + loom::kVersion, "print the version and exit");
  app.require_subcommand(1);
  app.fallthrough();  // global options (-o json, --server) may also follow the command
  GlobalOptions g;
  const char* env = std::getenv("LOOM_SERVER");
  g.server = env && *env ? env : "127.0.0.1:7450";
  std::string output = "human";
  app.add_option("--server", g.server, "the planner (or loomd --standalone) address; env LOOM_SERVER")
      ->capture_default_str();
  loom::security::CredentialFlags credentialFlags;
  loom::security::addCredentialFlags(app, credentialFlags, "your");
  app.add_option("-o,--output", output, "human or json")->check(CLI::IsMember({"human", "json"}));
  app.add_option("--deepspeed", g.overrides.deepspeedFile,
                 "run, submit, validate, plan: the spec's deepspeed config from this file (a DeepSpeed user's "
                 "ds_config.json)");
  app.add_option("--set", g.overrides.sets,
                 "run, submit, validate, plan: PATH=VALUE over the spec (repeatable; after --deepspeed's file), "
                 "e.g. deepspeed.optimizer.params.lr=1e-4");

  RunOptions run;
  auto* runCmd = app.add_subcommand("run", "run one job on this machine (embedded control plane); exit code = result");
  runCmd->add_option("file", run.file, "job spec (JSON)")->required();
  runCmd->add_option("--slots", run.slots, "ranks this machine runs at once (default: the job's ranks)");
  runCmd->add_option("--state-dir", run.stateDir, "where the job database and logs go (default: a new temp dir)");

  std::string file, requestId, jobId, reason;
  bool wait = false, follow = false;
  auto* submit = app.add_subcommand("submit", "submit a job; prints its id alone on stdout");
  submit->add_option("file", file, "job spec (JSON), - for stdin")->required();
  submit->add_option("--request-id", requestId, "makes retries idempotent: the same id returns the same job");
  submit->add_flag("--wait", wait, "wait for the job to end; exit code = result");

  auto* get = app.add_subcommand("get", "show a job: state, reason, ranks, metrics");
  get->add_option("id", jobId, "job id")->required();

  std::vector<std::string> states;
  int limit = 100;
  auto* list = app.add_subcommand("list", "list jobs, oldest first");
  list->add_option("--state", states, "only jobs in these states (e.g. RUNNING)");
  list->add_option("--limit", limit, "at most this many")->capture_default_str()->check(CLI::PositiveNumber);

  auto* watch = app.add_subcommand("watch", "follow a job's state changes and metrics until it ends");
  watch->add_option("id", jobId, "job id")->required();

  std::vector<int> ranks;
  int tail = 0, attempt = 0;
  auto* logs = app.add_subcommand("logs", "print a job's rank logs");
  logs->add_option("id", jobId, "job id")->required();
  logs->add_option("--rank", ranks, "only these ranks (repeatable)");
  logs->add_flag("-f,--follow", follow, "keep printing until the ranks end");
  logs->add_option("--tail", tail, "only the last N lines of each rank")->check(CLI::NonNegativeNumber);
  logs->add_option("--attempt", attempt, "attempt number (default: the latest)");

  auto* cancel = app.add_subcommand("cancel", "stop every rank of a job and end it CANCELLED");
  cancel->add_option("id", jobId, "job id")->required();
  cancel->add_option("--reason", reason, "recorded with the job");

  double timeoutS = 0;
  auto* waitCmd = app.add_subcommand("wait", "wait for a job to end; exit 0 iff it SUCCEEDED");
  waitCmd->add_option("id", jobId, "job id")->required();
  waitCmd->add_option("--timeout", timeoutS, "seconds (0: no limit)")->check(CLI::NonNegativeNumber);

  auto* validate = app.add_subcommand("validate", "check a job spec without submitting it");
  validate->add_option("file", file, "job spec (JSON), - for stdin")->required();

  int world = 0;
  auto* plan = app.add_subcommand("plan", "compile a train or eval job's plan and print it (local: no server)");
  plan->add_option("file", file, "job spec (JSON), - for stdin")->required();
  plan->add_option("--world", world, "plan for this many ranks instead of resources.ranks")
      ->check(CLI::Range(1, 65536));

  auto* nodes = app.add_subcommand("nodes", "list the node daemons attached to the planner");
  std::string nodeId;
  double drainTimeoutS = 600;
  auto* drain = app.add_subcommand("drain", "cordon a node and preempt its ranks (train jobs checkpoint and relaunch)");
  drain->add_option("node", nodeId, "node id (loomctl nodes)")->required();
  drain->add_option("--reason", reason, "recorded with the cordon and the jobs' events");
  drain->add_option("--timeout", drainTimeoutS, "seconds to wait for its ranks to end (0: no limit)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  auto* uncordon = app.add_subcommand("uncordon", "let a drained node take ranks again");
  uncordon->add_option("node", nodeId, "node id")->required();

  std::vector<std::string> pluginFiles;
  std::string kernelSpec;
  auto* kernelsCmd = app.add_subcommand(
      "kernels", "load the kernel plugins a rank here would (FILES, --spec's, LOOM_KERNEL_PATH's) and list their ops");
  kernelsCmd->add_option("files", pluginFiles, "plugin files or directories");
  kernelsCmd->add_option("--spec", kernelSpec, "a job spec whose kernels.plugins to load");

  loom::data::PrepareOptions prepare;
  auto* dataCmd = app.add_subcommand("data", "training data (local: no server)");
  dataCmd->require_subcommand(1);
  auto* prepareCmd = dataCmd->add_subcommand("prepare", "tokenize text or jsonl files into one token file");
  prepareCmd->add_option("inputs", prepare.inputs, "input files")->required();
  prepareCmd->add_option("--output", prepare.output, "the token file to write (e.g. train.tokens)")->required();
  prepareCmd->add_option("--format", prepare.format, "auto: jsonl for *.jsonl and *.json-lines, text otherwise")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "text", "jsonl"}));
  prepareCmd->add_option("--text-key", prepare.textKey, "jsonl: the key holding each document")->capture_default_str();
  prepareCmd->add_option("--separator", prepare.separator,
                         "text: a line equal to this ends a document (e.g. %); default: one document per file");
  prepareCmd->add_option("--tokenizer", prepare.tokenizer,
                         "a Hugging Face tokenizer directory (tokenizer.json; byte-level BPE as Llama 3, Qwen2, "
                         "Mistral); default: the byte tokenizer");

  GenerateOptions generate;
  auto* generateCmd = app.add_subcommand("generate", "generate from a served rollout job (rollout.serve true)");
  generateCmd->add_option("id", generate.jobId, "the rollout job")->required();
  auto* promptOpt = generateCmd->add_option("--prompt", generate.prompt, "prompt text (the job needs rollout.tokenizer)");
  auto* idsOpt = generateCmd->add_option("--token-ids", generate.tokenIds, "prompt token ids")->delimiter(',');
  auto* fileOpt = generateCmd->add_option(
      "--file", generate.file, "JSONL requests ({\"id\", \"prompt\" | \"prompt_token_ids\", \"sampling\"}), one batch");
  promptOpt->excludes(idsOpt)->excludes(fileOpt);
  idsOpt->excludes(fileOpt);
  generateCmd->add_option("--sampling", generate.samplingJson,
                          "JSON of vLLM SamplingParams keys over the job's rollout.sampling, e.g. "
                          "'{\"temperature\": 0, \"max_tokens\": 64}'");
  generateCmd->add_option("--wait", generate.waitS, "seconds to retry while the job does not serve yet")
      ->check(CLI::NonNegativeNumber);

  auto* rolloutCmd = app.add_subcommand("rollout", "control a served rollout job");
  rolloutCmd->require_subcommand(1);
  ReloadOptions reload;
  auto* reloadCmd = rolloutCmd->add_subcommand("reload", "swap in new weights (UpdateWeights)");
  reloadCmd->add_option("id", reload.jobId, "the rollout job")->required();
  auto* fromOpt = reloadCmd->add_option("--from", reload.dir,
                                        "a directory of safetensors, or a Loom checkpoint directory (its latest)");
  auto* fromJobOpt = reloadCmd->add_option("--from-job", reload.fromJob, "a train job: its latest checkpoint");
  fromOpt->excludes(fromJobOpt);
  reloadCmd->add_flag("--abort", reload.abortInFlight,
                      "end the requests in flight now (finish reason aborted) instead of letting them finish");
  reloadCmd->add_option("--version", reload.version, "the version the weights serve as (default: one more)")
      ->check(CLI::NonNegativeNumber);
  std::string rolloutJob;
  double statusWaitS = 0;
  auto* pauseCmd = rolloutCmd->add_subcommand("pause", "stop computing; requests wait with their KV cache");
  pauseCmd->add_option("id", rolloutJob, "the rollout job")->required();
  auto* resumeCmd = rolloutCmd->add_subcommand("resume", "compute again after pause");
  resumeCmd->add_option("id", rolloutJob, "the rollout job")->required();
  auto* statusCmd = rolloutCmd->add_subcommand("status", "weights version, requests, KV blocks");
  statusCmd->add_option("id", rolloutJob, "the rollout job")->required();
  statusCmd->add_option("--wait", statusWaitS, "seconds to retry while the job does not serve yet")
      ->check(CLI::NonNegativeNumber);

  PlotOptions plotOptions;
  auto* plotCmd = app.add_subcommand("plot", "draw a job's curves (every stored point) into a PNG or SVG file");
  plotCmd->add_option("id", plotOptions.jobId, "job id")->required();
  plotCmd->add_option("--metric", plotOptions.metrics, "metrics to draw, one panel each")
      ->delimiter(',')
      ->capture_default_str();
  plotCmd->add_option("--rank", plotOptions.rank, "whose reports")->capture_default_str()->check(CLI::NonNegativeNumber);
  plotCmd->add_option("-o,--file", plotOptions.file, "the picture: FILE.png or FILE.svg")->required();

  CertsOptions certs;
  auto* certsCmd = app.add_subcommand("certs", "certificates for TLS and mutual TLS (local: no server)");
  certsCmd->require_subcommand(1);
  auto* certsInit = certsCmd->add_subcommand("init", "create a CA in DIR and issue the planner's, nodes' and clients' "
                                                     "certificates");
  auto* certsIssue = certsCmd->add_subcommand("issue", "issue more certificates from DIR's CA");
  for (auto* cmd : {certsInit, certsIssue}) {
    cmd->add_option("dir", certs.dir, "the directory: ca.crt, ca.key, planner.crt/.key, nodes/, clients/")->required();
    cmd->add_option("--planner-name", certs.plannerNames,
                    "a DNS name or IP address the planner is reached at (repeatable; localhost and loopback are "
                    "always in)");
    cmd->add_option("--node", certs.nodes, "a node id: nodes/ID.crt and .key (repeatable)");
    cmd->add_option("--client", certs.clients, "USER:TENANT (a user) or USER::admin: clients/USER.crt and .key "
                                               "(repeatable)");
    cmd->add_option("--days", certs.days, "validity")->capture_default_str()->check(CLI::Range(1, 36500));
  }
  TokenOptions token;
  auto* tokenCmd = app.add_subcommand("token", "bearer tokens in a planner's tokens file (local: no server)");
  tokenCmd->require_subcommand(1);
  auto* tokenCreate = tokenCmd->add_subcommand("create", "add a token to the tokens file and print it (once)");
  auto* tokenRevoke = tokenCmd->add_subcommand("revoke", "remove every token of a user from the tokens file");
  for (auto* cmd : {tokenCreate, tokenRevoke}) {
    cmd->add_option("--tokens", token.tokensFile, "the planner's tokens file (loom-planner --tokens)")->required();
    cmd->add_option("--user", token.user, "the user (role node: the node id, or * for any node)")->required();
  }
  tokenCreate->add_option("--tenant", token.tenant, "the user's tenant (a user needs one)");
  tokenCreate->add_option("--role", token.role, "admin, user or node")->capture_default_str();

  std::string loopFile;
  auto* rlCmd = app.add_subcommand("rl", "RL post-training: rollout, score, train and update weights, N times");
  rlCmd->add_option("loop", loopFile, "the loop file (docs/post-training.md)")->required()->check(CLI::ExistingFile);

  CLI11_PARSE(app, argc, argv);
  g.format = output == "json" ? OutputFormat::kJson : OutputFormat::kHuman;
  auto credentials = loom::security::loadCredentials(credentialFlags);
  if (!credentials.isOk()) {
    std::fprintf(stderr, "loomctl: %s\n", credentials.status().message().c_str());
    return 2;
  }
  g.credentials = std::move(credentials).value();

  if (runCmd->parsed()) return runCommand(g, run);
  if (submit->parsed()) return submitCommand(g, file, requestId, wait);
  if (get->parsed()) return getCommand(g, jobId);
  if (list->parsed()) return listCommand(g, states, limit);
  if (watch->parsed()) return watchCommand(g, jobId);
  if (logs->parsed()) return logsCommand(g, jobId, ranks, follow, tail, attempt);
  if (cancel->parsed()) return cancelCommand(g, jobId, reason);
  if (waitCmd->parsed()) return waitCommand(g, jobId, timeoutS);
  if (validate->parsed()) return validateCommand(g, file);
  if (plan->parsed()) return planCommand(g, file, world);
  if (nodes->parsed()) return nodesCommand(g);
  if (drain->parsed()) return drainCommand(g, nodeId, reason, drainTimeoutS);
  if (uncordon->parsed()) return uncordonCommand(g, nodeId);
  if (kernelsCmd->parsed()) return kernelsCommand(g, pluginFiles, kernelSpec);
  if (prepareCmd->parsed()) return dataPrepareCommand(g, prepare);
  if (generateCmd->parsed()) {
    if (generate.prompt.empty() && generate.tokenIds.empty() && generate.file.empty()) {
      std::fprintf(stderr, "loomctl generate: give --prompt, --token-ids or --file\n");
      return 2;
    }
    return generateCommand(g, generate);
  }
  if (reloadCmd->parsed()) {
    if (reload.dir.empty() && reload.fromJob.empty()) {
      std::fprintf(stderr, "loomctl rollout reload: give --from DIR or --from-job TRAIN_JOB\n");
      return 2;
    }
    return rolloutReloadCommand(g, reload);
  }
  if (pauseCmd->parsed()) return rolloutControlCommand(g, "pause", rolloutJob, 0);
  if (resumeCmd->parsed()) return rolloutControlCommand(g, "resume", rolloutJob, 0);
  if (statusCmd->parsed()) return rolloutControlCommand(g, "status", rolloutJob, statusWaitS);
  if (rlCmd->parsed()) return rlCommand(g, loopFile);
  if (plotCmd->parsed()) return plotCommand(g, plotOptions);
  if (certsInit->parsed() || certsIssue->parsed()) {
    certs.createCa = certsInit->parsed();
    return certsCommand(certs);
  }
  if (tokenCreate->parsed()) return tokenCreateCommand(token);
  if (tokenRevoke->parsed()) return tokenRevokeCommand(token);
  return 2;
}
