#include "planner/mesh.h"

#include <set>

namespace loom::planner {

const char* meshAxisName(MeshAxis axis) {
  switch (axis) {
    case MeshAxis::kTensor: return "tensor";
    case MeshAxis::kSequence: return "sequence";
    case MeshAxis::kData: return "data";
    case MeshAxis::kDenseData: return "dense data";
    case MeshAxis::kExpert: return "expert";
    case MeshAxis::kExpertData: return "expert data";
  }
  return "?";
}

StatusOr<Mesh> Mesh::create(int world, int tp, int sp, int ep) {
  if (world < 1) return invalidArgument("resources.ranks: must be at least 1, got {}", world);
  if (tp < 1) return invalidArgument("tensor parallel size must be at least 1, got {}", tp);
  if (sp < 1) return invalidArgument("sequence_parallel_size must be at least 1, got {}", sp);
  if (ep < 1) return invalidArgument("expert parallel size must be at least 1, got {}", ep);
  if (world % (tp * sp) != 0)
    return invalidArgument("resources.ranks {} cannot be split into deepspeed.tensor_parallel.autotp_size {} x "
                           "deepspeed.sequence_parallel_size {}: {} is not a multiple of {}",
                           world, tp, sp, world, tp * sp);
  const int dp = world / (tp * sp);
  if ((dp * sp) % ep != 0)
    return invalidArgument("deepspeed.expert_parallel.autoep_size {} must divide data parallel x sequence parallel = "
                           "{} x {} = {} (resources.ranks {} over tensor parallel {}): the experts split over ranks "
                           "that hold the same tensor-parallel piece",
                           ep, dp, sp, dp * sp, world, tp);
  return Mesh(world, dp, sp, tp, ep);
}

Coordinates Mesh::coordinates(int rank) const {
  return Coordinates{.dp = rank / (sp_ * tp_), .sp = (rank / tp_) % sp_, .tp = rank % tp_};
}

std::vector<int> Mesh::group(MeshAxis axis, int rank) const {
  const Coordinates c = coordinates(rank);
  std::vector<int> out;
  switch (axis) {
    case MeshAxis::kTensor:
      for (int t = 0; t < tp_; ++t) out.push_back(rankAt({c.dp, c.sp, t}));
      break;
    case MeshAxis::kSequence:
      for (int s = 0; s < sp_; ++s) out.push_back(rankAt({c.dp, s, c.tp}));
      break;
    case MeshAxis::kData:
      for (int d = 0; d < dp_; ++d) out.push_back(rankAt({d, c.sp, c.tp}));
      break;
    case MeshAxis::kDenseData:
    case MeshAxis::kExpert:
    case MeshAxis::kExpertData: {
      // The dense-data group: every rank with this tensor-parallel index, in rank order.
      std::vector<int> dense;
      for (int d = 0; d < dp_; ++d)
        for (int s = 0; s < sp_; ++s) dense.push_back(rankAt({d, s, c.tp}));
      if (axis == MeshAxis::kDenseData) return dense;
      const int position = c.dp * sp_ + c.sp;  // this rank's index in `dense`
      if (axis == MeshAxis::kExpert) {
        const int first = position / ep_ * ep_;
        out.assign(dense.begin() + first, dense.begin() + first + ep_);
      } else {
        for (size_t i = position % ep_; i < dense.size(); i += ep_) out.push_back(dense[i]);
      }
      break;
    }
  }
  return out;
}

std::vector<std::vector<int>> Mesh::groups(MeshAxis axis) const {
  std::vector<std::vector<int>> out;
  std::set<int> covered;
  for (int r = 0; r < world_; ++r) {
    if (covered.count(r)) continue;
    auto g = group(axis, r);
    covered.insert(g.begin(), g.end());
    out.push_back(std::move(g));
  }
  return out;
}

}  // namespace loom::planner
