#pragma once

#include <cstdint>
#include <map>
#include <string>

#include <ATen/core/Tensor.h>

#include "backends/communicator.h"
#include "common/status.h"
#include "worker/torch/data/token_samples.h"
#include "worker/torch/model/decoder_model.h"
#include "worker/torch/parallel/rank_mesh.h"

namespace loom::worker {

struct EvalOptions {
  int64_t microBatchSize = 1;
  int64_t maxBatches = 0;         // micro-batches per data-parallel rank; 0: the whole file
  bool perToken = false;          // keep each token's values (EvalResult::perToken)
  bool entropy = false;           // the predictions' entropy
  DecoderModel* reference = nullptr;  // KL(reference || model), the reference laid out as the model
  bool packDocuments = false;     // data.pack_documents (TokenSamples::batch)
};

struct EvalResult {
  double meanLoss = 0;     // over every evaluated token (label not -100) of every rank
  double meanEntropy = 0;  // with EvalOptions::entropy
  double meanKl = 0;       // with EvalOptions::reference
  int64_t samples = 0;
  int64_t tokens = 0;      // the labels that count
  // [samples, seq_len] fp32 on every rank, with perToken: "logprobs", and "entropy" and "kl" when
  // they are computed (0 where the label is -100).
  std::map<std::string, at::Tensor> perToken;
};

// Evaluates the first samples of `data` in file order, without gradients: micro-batch b of
// data-parallel rank r holds samples [(b * dp + r) * micro, + micro), dp the mesh's data-parallel
// group. The ranks of a tensor-parallel group evaluate the same samples together (the
// vocabulary-parallel logprobs, entropy and KL, never gathered logits), and those of a
// sequence-parallel group each their share of the samples' tokens. Sums are all-reduced over
// dp x sp.
StatusOr<EvalResult> evaluate(DecoderModel& model, const TokenSamples& data, const EvalOptions& options,
                              const RankMesh& mesh);

}  // namespace loom::worker
