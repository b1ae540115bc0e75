#pragma once

#include <optional>
#include <string>
#include <vector>

#include "client/loomctl/output.h"
#include "common/security/credentials.h"
#include "worker/data/prepare.h"

namespace loom::loomctl {

// What the command line changes in a spec file before it is used (run, submit, validate, plan).
struct SpecOverrides {
  std::string deepspeedFile;      // --deepspeed FILE: the spec's deepspeed object, from this file
  std::vector<std::string> sets;  // --set PATH=VALUE: PATH dotted from the spec's root; VALUE JSON, else a string
};

struct GlobalOptions {
  std::string server;  // --server, else LOOM_SERVER, else 127.0.0.1:7450
  security::ClientCredentials credentials;  // --ca, --cert, --key, --token-file (credential_flags.h)
  OutputFormat format = OutputFormat::kHuman;
  SpecOverrides overrides;
};

// Each command returns the process exit code.
int submitCommand(const GlobalOptions& g, const std::string& file, const std::string& requestId, bool wait);
int getCommand(const GlobalOptions& g, const std::string& jobId);
int listCommand(const GlobalOptions& g, const std::vector<std::string>& states, int limit);
int watchCommand(const GlobalOptions& g, const std::string& jobId);
int logsCommand(const GlobalOptions& g, const std::string& jobId, const std::vector<int>& ranks, bool follow,
                int tail, int attempt);
int cancelCommand(const GlobalOptions& g, const std::string& jobId, const std::string& reason);
int waitCommand(const GlobalOptions& g, const std::string& jobId, double timeoutS);
int validateCommand(const GlobalOptions& g, const std::string& file);
// Compiles a train or eval job's Plan here (no server), as if it had `world` ranks when > 0, and
// prints a summary or, with -o json, the whole Plan. Exit 2 with the reason when it does not
// compile.
int planCommand(const GlobalOptions& g, const std::string& file, int world);
int nodesCommand(const GlobalOptions& g);
// Cordons the node and preempts its ranks, then waits (up to timeoutS; 0: no limit) until none
// is left on it. DEADLINE_EXCEEDED (exit 6) when some still run at the deadline.
int drainCommand(const GlobalOptions& g, const std::string& nodeId, const std::string& reason, double timeoutS);
int uncordonCommand(const GlobalOptions& g, const std::string& nodeId);
// Loads the kernel plugins a rank on this machine would load (`files`, the kernels.plugins of
// `specFile` when given, then LOOM_KERNEL_PATH's) and lists each with the ops it provides. A
// plugin that cannot be loaded (a wrong ABI version, no entry symbol) is the error, by file.
int kernelsCommand(const GlobalOptions& g, const std::vector<std::string>& files, const std::string& specFile);

struct RunOptions {
  std::string file;
  int slots = 0;           // 0: as many as the job has ranks
  std::string stateDir;    // empty: a new directory under $TMPDIR
};
// loomctl certs init DIR (createCa) and certs issue DIR: a CA, the planner's certificate, node
// and client certificates (docs/security.md names the files).
struct CertsOptions {
  std::string dir;
  bool createCa = false;
  std::vector<std::string> plannerNames;  // more names of the planner's certificate (DNS or IP)
  std::vector<std::string> nodes;         // node ids
  std::vector<std::string> clients;       // USER:TENANT, or USER::admin
  int days = 365;
};
int certsCommand(const CertsOptions& options);

// loomctl token create / revoke: a line of the planner's tokens file.
struct TokenOptions {
  std::string tokensFile;
  std::string user;
  std::string tenant;
  std::string role = "user";
};
int tokenCreateCommand(const TokenOptions& options);
int tokenRevokeCommand(const TokenOptions& options);

// Runs one job on an embedded control plane (planner + daemon in this process) and returns its
// result as the exit code.
int runCommand(const GlobalOptions& g, const RunOptions& options);

// A served rollout's RolloutService, through the planner. `waitS`: how long to retry while the
// job does not serve yet (its model loading).
struct GenerateOptions {
  std::string jobId;
  std::string prompt;             // text, or
  std::vector<int64_t> tokenIds;  // token ids, or
  std::string file;               // JSONL of requests (as a prompts file), sent as one batch
  std::string samplingJson;       // vLLM SamplingParams keys over the job's rollout.sampling
  double waitS = 0;
};
// Streams one request's text (or token ids) to stdout; with --file, prints one JSON line per
// sample once all are done.
int generateCommand(const GlobalOptions& g, const GenerateOptions& options);
struct ReloadOptions {
  std::string jobId;
  std::string dir;      // a directory of safetensors or a Loom checkpoint directory, or
  std::string fromJob;  // a train job, whose latest checkpoint is loaded
  bool abortInFlight = false;
  int64_t version = 0;
};
int rolloutReloadCommand(const GlobalOptions& g, const ReloadOptions& options);
// pause, resume or status.
int rolloutControlCommand(const GlobalOptions& g, const std::string& action, const std::string& jobId, double waitS);

// RL post-training: for each of the loop file's iterations, samples from a served rollout job, a
// score, a train job on them and the new weights loaded into the rollout job (rl_command.cc).
int rlCommand(const GlobalOptions& g, const std::string& loopFile);

// `loomctl plot`: a job's stored metrics as line charts over steps, one panel per metric.
struct PlotOptions {
  std::string jobId;
  std::vector<std::string> metrics{"loss", "eval_loss"};
  int rank = 0;
  std::string file;  // *.png or *.svg
};
int plotCommand(const GlobalOptions& g, const PlotOptions& options);

// Tokenizes text or jsonl files into one token file (worker/data/prepare.h) and prints what it
// wrote. Local: no server is contacted.
int dataPrepareCommand(const GlobalOptions& g, const data::PrepareOptions& options);

// Reads a spec file, relative paths taken from its directory, its DeepSpeed config file put in
// place, then the overrides applied (in that order: --set may change a key of the DeepSpeed
// file's). The error names the file, or the override.
StatusOr<std::string> readSpecFile(const std::string& path, const SpecOverrides& overrides = {});

}  // namespace loom::loomctl
