#include "worker/torch/parallel/whole_weights.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

namespace loom::worker {

StatusOr<TensorMap> wholeWeights(const DecoderModel& model, const TensorMap& pieces) {
  at::NoGradGuard noGrad;
  backends::Communicator& tp = model.tensorParallel();
  TensorMap out;
  const auto& params = model.parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    const std::string& name = params[i].first;
    auto it = pieces.find(name);
    if (it == pieces.end()) return internalError("checkpoint: no weights for {}", name);
    const ShardLayout& layout = model.shards().layouts[i];
    if (!layout.sharded() || tp.size() == 1) {
      out[name] = it->second;
      continue;
    }
    const at::Tensor piece = it->second.contiguous();
    std::vector<int64_t> sizes{tp.size()};
    sizes.insert(sizes.end(), layout.local.begin(), layout.local.end());
    at::Tensor all = at::empty(sizes, piece.options());
    RETURN_IF_ERROR(tp.allGather(all, piece)->wait().withContext("checkpoint: gathering " + name +
                                                                 " over the tensor-parallel group"));
    out[name] = assembleShards(all, layout, tp.size());
  }
  return out;
}

}  // namespace loom::worker
