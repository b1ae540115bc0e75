#include "worker/torch/parallel/whole_weights.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

namespace loom::worker {

StatusOr<at::Tensor> wholeParameter(const DecoderModel& model, int parameter, const at::Tensor& piece) {
  at::NoGradGuard noGrad;
  backends::Communicator& tp = model.tensorParallel();
  const ShardLayout& layout = model.shards().layouts[parameter];
  if (!layout.sharded() || tp.size() == 1) return piece;
  const at::Tensor mine = piece.contiguous();
  std::vector<int64_t> sizes{tp.size()};
  sizes.insert(sizes.end(), layout.local.begin(), layout.local.end());
  at::Tensor all = at::empty(sizes, mine.options());
  RETURN_IF_ERROR(tp.allGather(all, mine)->wait().withContext("gathering " + model.parameters()[parameter].first +
                                                              " over the tensor-parallel group"));
  return assembleShards(all, layout, tp.size());
}

}  // namespace loom::worker
