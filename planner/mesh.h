#pragma once

#include <vector>

#include "common/status.h"

namespace loom::planner {

enum class MeshAxis {
  kTensor,         // tp: ranks that split one layer's matrices
  kSequence,       // sp: ranks that split the sequence (Ulysses)
  kData,           // dp: replicas that see different batches
  kDenseData,      // dp x sp: the ranks a dense parameter's gradients are averaged (and ZeRO-partitioned) over
  kExpert,         // ep: ranks that split the experts, taken from the dense-data group
  kExpertData,     // dp x sp / ep: the ranks an expert parameter is data-parallel over
};

const char* meshAxisName(MeshAxis axis);

struct Coordinates {
  int dp = 0, sp = 0, tp = 0;
};

// The device mesh of a job: world = dp x sp x tp, tp varying fastest (so a tensor-parallel group
// is consecutive ranks, inside a node), then sp, then dp. Experts are split over ep ranks taken
// from each dense-data-parallel group, consecutively (DeepSpeed's layout): expert-parallel
// groups are runs of ep ranks of that group, expert-data-parallel groups its strided members.
// Every rank list is in ascending rank order. Pure and immutable.
class Mesh {
 public:
  // InvalidArgument naming what does not fit (world vs tp x sp, ep vs dp x sp, ...).
  static StatusOr<Mesh> create(int world, int tp, int sp, int ep);

  int world() const { return world_; }
  int dp() const { return dp_; }
  int sp() const { return sp_; }
  int tp() const { return tp_; }
  int ep() const { return ep_; }

  Coordinates coordinates(int rank) const;
  int rankAt(const Coordinates& c) const { return (c.dp * sp_ + c.sp) * tp_ + c.tp; }
  // The rank's index in its expert-parallel group: which experts it holds (parallel_checks.h).
  int expertIndex(int rank) const { return (rank / tp_) % ep_; }
  // The group of `axis` that holds `rank`.
  std::vector<int> group(MeshAxis axis, int rank) const;
  // Every group of `axis`, each once, ordered by their first rank.
  std::vector<std::vector<int>> groups(MeshAxis axis) const;

 private:
  Mesh(int world, int dp, int sp, int tp, int ep) : world_(world), dp_(dp), sp_(sp), tp_(tp), ep_(ep) {}

  int world_, dp_, sp_, tp_, ep_;
};

}  // namespace loom::planner
