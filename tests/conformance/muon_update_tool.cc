// Muon's update of single matrices, for tests/oracles/muon_test.py to hold against DeepSpeed's own
// muon_update on the same inputs:
//   loom-muon-update INPUT OUTPUT METHOD BETA [fused]
// (fused: Newton-Schulz with GEMM epilogues, as a GPU runs it, in place of DeepSpeed's order)
// INPUT (safetensors): for each matrix k, "<k>.grad" and "<k>.momentum" (fp32, 2-D) and
// "<k>.head_width" (int64 [1]; 0: the whole matrix). OUTPUT: "<k>.update" and "<k>.momentum".
#include <cstdio>
#include <cstdlib>
#include <string>

#include <ATen/ATen.h>

#include "worker/torch/checkpoint/safetensors.h"
#include "worker/torch/optim/muon.h"
#include "worker/torch/optim/newton_schulz.h"

int main(int argc, char** argv) {
  using namespace loom;
  if (argc != 5 && argc != 6) {
    std::fprintf(stderr, "usage: loom-muon-update INPUT OUTPUT gram|standard BETA [fused]\n");
    return 2;
  }
  const worker::NsKernels kernels =
      argc == 6 && std::string(argv[5]) == "fused" ? worker::NsKernels::kFused : worker::NsKernels::kDeepSpeedOrder;
  const planner::NsMethod method = std::string(argv[3]) == "gram" ? planner::NsMethod::kGram : planner::NsMethod::kStandard;
  const double beta = std::atof(argv[4]);
  auto input = worker::loadSafetensors(argv[1]);
  if (!input.isOk()) {
    std::fprintf(stderr, "%s\n", input.status().message().c_str());
    return 1;
  }
  worker::TensorMap out;
  for (const auto& [name, grad] : *input) {
    const std::string suffix = ".grad";
    if (name.size() <= suffix.size() || name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0) continue;
    const std::string k = name.substr(0, name.size() - suffix.size());
    at::Tensor g = grad.clone();
    at::Tensor momentum = worker::advanceMomentum(g, input->at(k + ".momentum"), beta);
    out[k + ".update"] = worker::orthogonalize(g, method, input->at(k + ".head_width").item<int64_t>(), kernels);
    out[k + ".momentum"] = momentum;
  }
  Status saved = worker::saveSafetensorsFile(argv[2], out);
  if (!saved.isOk()) {
    std::fprintf(stderr, "%s\n", saved.message().c_str());
    return 1;
  }
  return 0;
}
