#include "worker/torch/model/activation_checkpointing.h"

#include <vector>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include "worker/torch/model/decoder_model.h"

namespace loom::worker {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

// Autograd's node for a checkpointed layer. Forward (run by autograd under no grad) keeps the
// input and the routing; backward recomputes the layer with gradients on, replaying the routing,
// and back-propagates the output's gradient through that graph: the parameters' gradients
// accumulate as they would have (and the ZeRO engines' hooks around the block see them), the
// input's is returned.
struct CheckpointedLayerFunction : public torch::autograd::Function<CheckpointedLayerFunction> {
  static tensor_list forward(AutogradContext* ctx, const at::Tensor& input, int64_t model, int64_t index,
                             bool toHost) {
    auto* m = reinterpret_cast<DecoderModel*>(model);
    RoutingRecord record;
    const at::Tensor hidden = m->decoderLayer(static_cast<int>(index), input, RoutingMode::kRecord, &record);
    if (toHost && !input.is_cpu()) {
      at::Tensor host = at::empty(input.sizes(), input.options().device(at::kCPU).pinned_memory(true));
      host.copy_(input, /*non_blocking=*/true);
      ctx->saved_data["host_input"] = host;
      ctx->saved_data["device"] = static_cast<int64_t>(input.device().index());
    } else {
      ctx->save_for_backward({input});
    }
    ctx->saved_data["model"] = model;
    ctx->saved_data["index"] = index;
    ctx->saved_data["moe"] = record.experts.defined();
    if (record.experts.defined()) {
      ctx->saved_data["experts"] = record.experts;
      ctx->saved_data["counts"] = record.counts;
      ctx->saved_data["arrived"] = record.arrived;
    }
    if (record.routerLogits.defined()) return {hidden, record.routerLogits};
    return {hidden};
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    auto* m = reinterpret_cast<DecoderModel*>(ctx->saved_data["model"].toInt());
    const int index = static_cast<int>(ctx->saved_data["index"].toInt());
    at::Tensor input;
    if (ctx->saved_data.count("host_input")) {
      const at::Device device(at::kCUDA, static_cast<c10::DeviceIndex>(ctx->saved_data["device"].toInt()));
      input = ctx->saved_data["host_input"].toTensor().to(device, /*non_blocking=*/true);
    } else {
      input = ctx->get_saved_variables()[0];
    }
    const at::Tensor x = input.detach().requires_grad_(true);
    RoutingRecord record;
    const bool moe = ctx->saved_data["moe"].toBool();
    if (moe) {
      record.experts = ctx->saved_data["experts"].toTensor();
      record.counts = ctx->saved_data["counts"].toIntVector();
      record.arrived = ctx->saved_data["arrived"].toIntVector();
    }
    std::vector<at::Tensor> outputs, outputGrads;
    {
      at::AutoGradMode withGrad(true);
      outputs.push_back(m->decoderLayer(index, x, moe ? RoutingMode::kReplay : RoutingMode::kRoute, &record));
      outputGrads.push_back(grads[0]);
      if (grads.size() > 1 && grads[1].defined() && record.routerLogits.defined()) {
        outputs.push_back(record.routerLogits);
        outputGrads.push_back(grads[1]);
      }
    }
    torch::autograd::backward(outputs, outputGrads);
    // The record (and the experts it held) goes with this node: the replay is over.
    return {x.grad(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

CheckpointedOutput checkpointedLayer(DecoderModel& model, int index, const at::Tensor& input,
                                     const ActivationCheckpointing& options) {
  // An input without a gradient (a frozen embedding before the first layer) would leave the
  // node out of the graph, and the layer's parameters without gradients.
  const at::Tensor in = input.requires_grad() ? input : input.detach().requires_grad_(true);
  const tensor_list out = CheckpointedLayerFunction::apply(in, reinterpret_cast<int64_t>(&model),
                                                           static_cast<int64_t>(index), options.toHost);
  return {out[0], out.size() > 1 ? out[1] : at::Tensor()};
}

}  // namespace loom::worker
