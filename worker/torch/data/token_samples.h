#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "common/status.h"
#include "worker/data/token_file.h"

namespace loom::worker {

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

 private:
  TokenSamples(data::TokenFile file, int64_t seqLen);

  data::TokenFile file_;
  int64_t seqLen_;
  int64_t numSamples_;
};

}  // namespace loom::worker
