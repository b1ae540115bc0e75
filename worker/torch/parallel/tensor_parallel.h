#pragma once

#include <ATen/core/Tensor.h>

#include "backends/communicator.h"
#include "worker/torch/parallel/tensor_shards.h"

namespace loom::worker {

// The autograd functions that tensor-parallel layers are built from (Megatron-LM's f and g, as
// DeepSpeed's AutoTP layers use them). Each runs its collective over `tp`, the tensor-parallel
// group; every rank of the group calls them in the same order. A failed collective throws (the
// runtime turns it into the job's error).

// Identity forward; backward sums the gradient over the group. On the input of column-parallel
// layers and of the vocabulary-parallel head (each rank's slice of the output features gives only
// its part of the input's gradient).
at::Tensor copyToTensorParallel(const at::Tensor& x, backends::Communicator& tp);
// Sums over the group forward; identity backward. On the output of row-parallel layers and of the
// vocabulary-parallel embedding.
at::Tensor reduceFromTensorParallel(const at::Tensor& x, backends::Communicator& tp);
// Gradient hooks on the parameters themselves (not autograd functions around their use, whose
// saved views would pin ZeRO-3's gathered storage until backward):
// - a whole parameter each rank applies to its own heads only (q/k norms): its gradient summed
//   over the group;
// - a KV projection's piece when `layout` shares each KV head among several ranks
//   (layout.replicas > 1): its gradient summed over the ranks that share the head.
void sumGradientOverGroup(at::Tensor& parameter, backends::Communicator& tp);
void sumGradientOverKvReplicas(at::Tensor& parameter, const ShardLayout& layout, backends::Communicator& tp);

// The vocabulary-parallel embedding (DeepSpeed's VocabParallelEmbedding): this rank's table holds
// rows [vocabStart, vocabStart + rows); ids outside them look up zeros, and the sum over the
// group gives every rank the whole lookup. ids [B, S] -> [B, S, hidden].
at::Tensor vocabParallelEmbedding(const at::Tensor& table, const at::Tensor& ids, int64_t vocabStart,
                                  backends::Communicator& tp);

}  // namespace loom::worker
