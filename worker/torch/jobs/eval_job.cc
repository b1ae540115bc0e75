#include "worker/torch/jobs/eval_job.h"

#include <cstdio>

#include <fmt/format.h>

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
    ASSIGN_OR_RETURN(BuiltModel built, buildModel(spec, rank_.local, rank_.device, mesh));
    ASSIGN_OR_RETURN(TokenSamples data, TokenSamples::open(spec.data.eval, spec.data.seqLen,
                                                           built.model->config().vocabSize, "data.eval"));
    // The KL's reference: the same config and layout, its own weights.
    std::unique_ptr<DecoderModel> reference;
    if (!spec.eval.klReference.empty()) {
      planner::JobSpec referenceSpec = spec;
      referenceSpec.model.weights = spec.eval.klReference;
      auto referenceModel = buildModel(referenceSpec, rank_.local, rank_.device, mesh);
      if (!referenceModel.isOk()) return referenceModel.status().withContext("eval.kl_reference");
      reference = std::move(referenceModel->model);
    }
    const bool perToken = !spec.eval.logprobsOutput.empty();
    ASSIGN_OR_RETURN(EvalResult r, evaluate(*built.model, data,
                                            {.microBatchSize = spec.deepspeed.microBatchSize,
                                             .maxBatches = spec.eval.maxBatches,
                                             .perToken = perToken,
                                             .entropy = spec.eval.entropy,
                                             .reference = reference.get(),
                                             .packDocuments = spec.data.packDocuments},
                                            mesh));
    std::map<std::string, double> metrics{{"eval_loss", r.meanLoss}, {"eval_tokens", static_cast<double>(r.tokens)}};
    if (spec.eval.entropy) metrics["eval_entropy"] = r.meanEntropy;
    if (reference) metrics["eval_kl"] = r.meanKl;
    rank_.progress(1, metrics);
    if (mesh.rank == 0) {
      std::printf("eval: loss %.6f over %lld samples (%lld tokens)%s%s\n", r.meanLoss,
                  static_cast<long long>(r.samples), static_cast<long long>(r.tokens),
                  spec.eval.entropy ? fmt::format(", entropy {:.6f}", r.meanEntropy).c_str() : "",
                  reference ? fmt::format(", KL(reference || model) {:.6f}", r.meanKl).c_str() : "");
      if (perToken) {
        RETURN_IF_ERROR(saveSafetensorsFile(spec.eval.logprobsOutput, r.perToken)
                            .withContext("eval.logprobs_output"));
        std::printf("eval: per-token values [%lld, %lld] written to %s\n", static_cast<long long>(r.samples),
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
