#pragma once

#include <cstdint>
#include <limits>
#include <vector>

namespace loom::planner {

// A piece of one parameter inside a rank's partition of a flat buffer.
struct ZeroFragment {
  int parameter = 0;             // index in the list given
  int64_t parameterOffset = 0;   // first element of the parameter in this fragment
  int64_t length = 0;            // elements
  int64_t partitionOffset = 0;   // where the fragment starts in the rank's partition
};

// ZeRO stages 1 and 2 (DeepSpeed's stage_1_and_2): the parameters of a group are laid end to end
// in one flat buffer, padded to a multiple of alignment x dp elements (DeepSpeed aligns to 2 x dp
// for NCCL), and cut into dp equal partitions. A parameter may straddle two partitions.
struct FlatPartition {
  int64_t flatNumel = 0;       // with the padding
  int64_t partitionNumel = 0;  // per rank
  int64_t padding = 0;         // at the end of the last partition
  std::vector<std::vector<ZeroFragment>> fragments;  // by data-parallel rank
};
FlatPartition partitionFlat(const std::vector<int64_t>& numels, int dp, int alignment = 2);

// ZeRO stage 3: every parameter is partitioned on its own into dp parts of ceil(numel / dp)
// elements (the last part padded), except those of at most stage3_param_persistence_threshold
// elements, which stay whole on every rank while their running total stays within
// stage3_model_persistence_threshold (DeepSpeed's order: the parameters as listed).
struct ParameterPartition {
  bool persistent = false;
  int64_t partitionNumel = 0;  // per rank; the whole parameter when persistent
};
std::vector<ParameterPartition> partitionPerParameter(const std::vector<int64_t>& numels, int dp,
                                                      int64_t persistenceThreshold,
                                                      int64_t modelPersistenceThreshold = std::numeric_limits<int64_t>::max());

}  // namespace loom::planner
