#pragma once

#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>

#include "planner/plan.h"
#include "worker/checkpoint/shard_layout.h"

namespace loom::worker {

// A rank's piece of a parameter (checkpoint/shard_layout.h: torch-free, for the convert job too).
using checkpoint::ShardLayout;
using checkpoint::shardLayout;

// This rank's piece of `whole` (a copy, contiguous).
at::Tensor takeShard(const at::Tensor& whole, const ShardLayout& layout);
// The whole tensor from every tensor-parallel rank's piece, `pieces` [tp, local...] in rank
// order (ranks sharing a replicated KV head hold equal pieces: the first of each is taken).
at::Tensor assembleShards(const at::Tensor& pieces, const ShardLayout& layout, int tpSize);

}  // namespace loom::worker
