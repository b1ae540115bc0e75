#include "worker/torch/jobs/eval_job.h"

#include <cstdio>

#include "worker/torch/checkpoint/safetensors.h"
#include "worker/torch/data/token_samples.h"
#include "worker/torch/jobs/evaluation.h"
#include "worker/torch/model/model_setup.h"

namespace loom::worker {

namespace {

class EvalRunner final : public JobRunner {
 public:
  explicit EvalRunner(RankSetup& rank) : rank_(rank) {}

  Status run() override {
    const planner::JobSpec& spec = rank_.spec;
    const RankMesh& mesh = rank_.mesh;
    ASSIGN_OR_RETURN(BuiltModel built, buildModel(spec, rank_.plan, rank_.device, mesh.tensor));
    ASSIGN_OR_RETURN(TokenSamples data, TokenSamples::open(spec.data.eval, spec.data.seqLen,
                                                           built.model->config().vocabSize, "data.eval"));
    const bool wantLogprobs = !spec.eval.logprobsOutput.empty();
    ASSIGN_OR_RETURN(EvalResult r, evaluate(*built.model, data, spec.deepspeed.microBatchSize, spec.eval.maxBatches,
                                            wantLogprobs, *mesh.denseData));
    rank_.progress(1, {{"eval_loss", r.meanLoss}, {"eval_tokens", static_cast<double>(r.tokens)}});
    if (mesh.rank == 0) {
      std::printf("eval: loss %.6f over %lld samples (%lld tokens)\n", r.meanLoss, static_cast<long long>(r.samples),
                  static_cast<long long>(r.tokens));
      if (wantLogprobs) {
        RETURN_IF_ERROR(saveSafetensorsFile(spec.eval.logprobsOutput, {{"logprobs", r.logprobs}})
                            .withContext("eval.logprobs_output"));
        std::printf("eval: logprobs [%lld, %lld] written to %s\n", static_cast<long long>(r.samples),
                    static_cast<long long>(spec.data.seqLen), spec.eval.logprobsOutput.c_str());
      }
      std::fflush(stdout);
    }
    return mesh.world->barrier()->wait();
  }

 private:
  RankSetup& rank_;
};

}  // namespace

StatusOr<std::unique_ptr<JobRunner>> makeEvalRunner(RankSetup& rank) {
  return std::unique_ptr<JobRunner>(std::make_unique<EvalRunner>(rank));
}

}  // namespace loom::worker
