#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "planner/deepspeed_config.h"
#include "planner/memory_estimate.h"
#include "planner/parallel_checks.h"
#include "planner/tensor_parallel.h"
#include "planner/zero_partition.h"

namespace loom::planner {

// The Plan of a train or eval job: how its ranks split the model, compiled once from the job spec
// and the model's config.json (plan_compiler.h) and then trusted by every rank. Plain values, no
// protobuf and no I/O: proto/convert.h turns it into loom.v1.Plan (proto/loom/v1/plan.proto),
// which mirrors it field by field. Rank lists are in ascending order; groups are ordered by their
// first rank.

// world = dp x sp x tp, tp varying fastest (planner/mesh.h); experts split over ep ranks taken
// from each dense-data group.
struct PlanMesh {
  int world = 1, dp = 1, sp = 1, tp = 1, ep = 1;
  int denseData() const { return dp * sp; }        // the ZeRO group of dense parameters
  int expertData() const { return dp * sp / ep; }  // the ZeRO group of expert parameters
};

using RankGroups = std::vector<std::vector<int>>;

// Every process group of every axis (mesh.h's MeshAxis), each once.
struct PlanGroups {
  RankGroups tensor, sequence, data, denseData, expert, expertData;
};

// One tensor of the checkpoint as HF names and shapes it, and where it lives.
struct ParameterSpec {
  std::string name;
  std::vector<int64_t> shape;
  std::string dtype;           // on the device: "bfloat16", "float16" or "float32"
  bool trainable = true;       // false: a buffer, saved but never given a gradient nor partitioned by ZeRO
  // train.frozen_parameters: no gradient and no optimizer state, so outside the ZeRO 1-2 buffers
  // (ZeRO 3 still partitions its weights, as it does every weight).
  bool frozen = false;
  LayerRole role = LayerRole::kOther;
  int layer = -1;              // its decoder layer; -1 for the embedding, final norm and head

  // Tensor parallelism: the split, the dimension split (-1 when whole) and each rank's shape.
  TpSplit split = TpSplit::kReplicated;
  int splitDim = -1;
  std::vector<int64_t> localShape;
  int kvReplication = 1;             // GQA with more ranks than KV heads: ranks sharing one KV head
  std::vector<int64_t> subParams;    // per-rank sizes of sub-parameters packed along splitDim (layer_specs shape)
  bool gatherOutput = false;         // column split whose output is all-gathered
  bool gradAllreduce = false;        // whole, its gradient summed over the tensor-parallel group
  // The layout in plain words where the shapes do not say it all (heads per rank, GQA,
  // vocabulary, tying); empty for the experts, whose layout is their kind's.
  std::string layout;
  std::string tiedTo;                // a tied embedding: the head it also is ("lm_head.weight")

  // Expert parallelism: the expert and the index, in its expert-parallel group, of the rank that
  // holds it; -1 for dense parameters.
  int expert = -1;
  int expertOwner = -1;

  // Muon (optimizer_rules.h): a matrix Newton-Schulz orthogonalizes, and with per_head_muon the
  // width of the heads its rows are blocked by (0: the whole matrix at once).
  bool muon = false;
  int64_t muonHeadDim = 0;

  // ZeRO stage 3: whole on every rank of its ZeRO group (persistent), or cut into parts of
  // partitionNumel elements (the last padded). Stages 0 to 2 leave both at their defaults.
  bool persistent = false;
  int64_t partitionNumel = 0;

  int64_t numel() const;
  int64_t localNumel() const;
};

// ZeRO stages 1 and 2 lay each block's parameters end to end in a flat buffer and cut it into
// equal partitions, one per rank of the ZeRO group (zero_partition.h). A block is the
// embedding (0), a decoder layer (l + 1) or the final norm and head (numLayers + 1), as the
// worker runs them; a layer's experts form a buffer of their own over the expert-data-parallel
// group.
struct FlatBufferSpec {
  int block = 0;
  bool experts = false;
  int groupSize = 1;  // ranks it is partitioned over
  // The parameters in buffer order, as indices into Plan::parameters: one list for a dense
  // buffer, one per expert-parallel index for an expert buffer (each holds its own experts, in
  // the same shapes and order).
  std::vector<std::vector<int>> members;
  FlatPartition partition;  // a fragment's `parameter` is a position in a members list
};

struct ZeroPlan {
  int stage = 0;
  int denseGroupSize = 1;    // dp x sp
  int expertGroupSize = 1;   // dp x sp / ep
  int64_t persistenceThreshold = 0;       // stage3_param_persistence_threshold
  int64_t modelPersistenceThreshold = 0;  // stage3_model_persistence_threshold, counted per group
  bool offloadOptimizer = false;
  std::vector<FlatBufferSpec> buffers;    // stages 1 and 2
};

struct Plan {
  std::string jobName;
  std::string modelFamily;     // the config's model_type
  bool training = true;        // train job (eval: no gradients nor optimizer state)
  Precision precision = Precision::kFp32;
  int64_t microBatch = 1;      // per rank
  int64_t sequenceLength = 0;
  PlanMesh mesh;
  PlanGroups groups;
  std::optional<ExpertRouting> routing;   // with expert_parallel enabled
  std::vector<ParameterSpec> parameters;  // every tensor of the checkpoint, in HF's order
  ZeroPlan zero;
  MemoryEstimate memory;                  // per rank: every rank holds the same amounts
  int64_t deviceMemoryBytes = 0;          // what it was checked against; 0: no limit

  int64_t totalElements() const;  // of every parameter and buffer, whole
};

// Indices of the parameters `rank` holds (a part of, under tensor parallelism): every dense one,
// and the experts of its expert-parallel index.
std::vector<int> parametersOfRank(const Plan& plan, int rank);
// The Plan as `rank` executes it: its parameters only (parametersOfRank), in the same order, the
// ZeRO buffers' members renumbered into that list, and each expert buffer left with the one
// members list of this rank's expert-parallel index. Without expert parallelism it equals `plan`.
Plan planOfRank(const Plan& plan, int rank);
// Elements of the model shard `rank` holds in its layers: tensor-parallel shapes, its experts.
int64_t shardElements(const Plan& plan, int rank);
// Elements of the model's weights `rank` keeps between uses: at stage 3 its partitions plus the
// persistent parameters and buffers; at stages 0 to 2 its whole shard.
int64_t keptElements(const Plan& plan, int rank);

}  // namespace loom::planner
