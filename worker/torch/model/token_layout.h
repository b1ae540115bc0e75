#pragma once

#include <ATen/core/Tensor.h>

namespace loom::worker {

// Where the tokens a rank's model sees sit in their samples, for RoPE and the attention mask.
// Empty (the default): every sample is one document, whose positions count from its first token
// and whose attention is plainly causal; under sequence parallelism the rank's tokens are its
// contiguous share of each sample, and their positions follow from its place in the group.
struct TokenLayout {
  at::Tensor positions;  // [B, s] int64: the position of each of the rank's tokens in its document
  at::Tensor documents;  // [B, S] int64: the document of every token of the whole samples

  bool packed() const { return documents.defined(); }
  TokenLayout to(const at::Device& device) const {
    if (!packed()) return {};
    return {positions.to(device), documents.to(device)};
  }
};

}  // namespace loom::worker
