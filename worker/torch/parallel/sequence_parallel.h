#pragma once

#include <ATen/core/Tensor.h>

#include "backends/communicator.h"

namespace loom::worker {

// Ulysses sequence parallelism (DeepSpeed's DistributedAttention): each rank of the
// sequence-parallel group `sp` holds a contiguous 1/sp of every sample's tokens, and around
// attention an all-to-all trades that for the whole sequence of 1/sp of the heads, and back
// afterwards. Both exchanges are autograd functions whose backward is the other exchange; every
// rank of the group calls them in the same order. A failed collective throws.

// x [B, s, sp, h, D]: this rank's s tokens of every head, head group j (h heads) meant for rank
// j -> [B, s * sp, h, D]: the whole sequence of this rank's head group, rank i's tokens i-th.
at::Tensor gatherSequence(const at::Tensor& x, backends::Communicator& sp);
// The inverse: x [B, S, h, D], this rank's head group over the whole sequence -> [B, S / sp, sp,
// h, D]: this rank's tokens of every head group, group j from rank j.
at::Tensor scatterSequence(const at::Tensor& x, backends::Communicator& sp);

// KV heads k [B, s, Hkv, D] made ready for the exchange: as they are when sp divides Hkv; when
// sp is a multiple of Hkv, each head repeated sp / Hkv times, so that rank r receives KV head
// r / (sp / Hkv), the one its query heads read (DeepSpeed's replication; the repeats' gradients
// add up in backward). The planner refuses any other count (planner/parallel_checks.h).
at::Tensor kvHeadsForSequenceParallel(const at::Tensor& k, int sp);

}  // namespace loom::worker
