#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "common/status.h"
#include "worker/data/token_file.h"
#include "worker/torch/model/token_layout.h"

namespace loom::worker {

// A micro-batch as one rank's model sees it: the inputs and their next-token labels, shifted on
// the whole samples and then cut to the rank's contiguous share of the sequence (under sequence
// parallelism the last token of a share is trained on the first label of the next).
struct TokenBatch {
  at::Tensor inputs;  // [B, s] int64, s = seq_len / sp
  at::Tensor labels;  // [B, s] int64; -100 where a label would cross into another document
  TokenLayout layout;  // with packed documents
  int64_t labelsCounted = 0;  // labels of this rank that are not -100
  int64_t labelsInSamples = 0;  // ... of the whole samples, every rank of the group together

  // This rank's weight in the samples' mean loss: its share of the labels that count.
  double share() const {
    return labelsInSamples ? static_cast<double>(labelsCounted) / static_cast<double>(labelsInSamples) : 0.0;
  }
};

// A token file seen as samples of seq_len + 1 consecutive tokens (worker/data/sample_order.h):
// sample i starts at token i * seq_len.
class TokenSamples {
 public:
  // `field` names the spec field in errors ("data.train"). The file's vocabulary must fit the
  // model's, and it must hold at least one sample.
  static StatusOr<TokenSamples> open(const std::string& path, int64_t seqLen, int64_t modelVocab,
                                     const std::string& field);

  int64_t numSamples() const { return numSamples_; }
  int64_t seqLen() const { return seqLen_; }
  // [samples.size(), seq_len + 1] int64.
  at::Tensor gather(const std::vector<int64_t>& samples) const;
  // The micro-batch of `samples` for rank `spRank` of a sequence-parallel group of `sp`. With
  // `packDocuments` the file's documents shape it: positions restart at each document start (and
  // at the sample's first token, for a document begun in an earlier sample), attention stays
  // within a document, and a document's last token has no label.
  TokenBatch batch(const std::vector<int64_t>& samples, bool packDocuments, int spRank = 0, int sp = 1) const;

 private:
  TokenSamples(data::TokenFile file, int64_t seqLen);

  data::TokenFile file_;
  int64_t seqLen_;
  int64_t numSamples_;
};

}  // namespace loom::worker
