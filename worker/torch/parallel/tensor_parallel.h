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
// layers (each rank's slice of the output features gives only its part of the input's gradient),
// and on a whole weight that each rank uses for its own heads only (q/k norms).
at::Tensor copyToTensorParallel(const at::Tensor& x, backends::Communicator& tp);
// Sums over the group forward; identity backward. On the output of row-parallel layers and of the
// vocabulary-parallel embedding.
at::Tensor reduceFromTensorParallel(const at::Tensor& x, backends::Communicator& tp);
// Identity forward on a KV projection's piece when `layout` shares each KV head among several
// ranks (layout.replicas > 1); backward sums its gradient over the ranks that share the head.
at::Tensor sumOverKvReplicas(const at::Tensor& weight, const ShardLayout& layout, backends::Communicator& tp);

// The vocabulary-parallel embedding (DeepSpeed's VocabParallelEmbedding): this rank's table holds
// rows [vocabStart, vocabStart + rows); ids outside them look up zeros, and the sum over the
// group gives every rank the whole lookup. ids [B, S] -> [B, S, hidden].
at::Tensor vocabParallelEmbedding(const at::Tensor& table, const at::Tensor& ids, int64_t vocabStart,
                                  backends::Communicator& tp);

}  // namespace loom::worker
