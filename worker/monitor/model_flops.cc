#include "worker/monitor/model_flops.h"

namespace loom::worker {

double trainingFlopsPerToken(const planner::ModelConfig& c, int64_t parameters, int64_t seqLen) {
  if (c.isMoe() || c.isMla()) return 0;
  const double lookup = c.tieWordEmbeddings ? 0 : static_cast<double>(c.vocabSize * c.hiddenSize);
  const double matmulParameters = static_cast<double>(parameters) - lookup;
  const double headDim = c.headDim > 0 ? static_cast<double>(c.headDim) : static_cast<double>(c.hiddenSize / c.numHeads);
  return 6 * matmulParameters +
         12 * static_cast<double>(c.numLayers) * static_cast<double>(c.numHeads) * headDim * static_cast<double>(seqLen);
}

double peakFlopsPerSecond(std::string_view name, planner::Precision precision) {
  struct Peak {
    std::string_view prefix;  // the CUDA device name starts with it
    double halfTflops;        // bf16 / fp16, dense
    double fp32Tflops;
  };
  // NVIDIA's datasheets (SXM parts; the PCIe H100 is slower and named apart).
  static constexpr Peak kPeaks[] = {
      {"NVIDIA H100 PCIe", 756.0, 51.2}, {"NVIDIA H100 NVL", 835.0, 60.0}, {"NVIDIA H100", 989.4, 66.9},
      {"NVIDIA H200", 989.4, 66.9},      {"NVIDIA H800", 989.4, 66.9},    {"NVIDIA GH200", 989.4, 66.9},
      {"NVIDIA A100", 312.0, 19.5},      {"NVIDIA A800", 312.0, 19.5},    {"NVIDIA B200", 2250.0, 80.0},
  };
  for (const Peak& p : kPeaks) {
    if (name.substr(0, p.prefix.size()) == p.prefix)
      return (precision == planner::Precision::kFp32 ? p.fp32Tflops : p.halfTflops) * 1e12;
  }
  return 0;
}

}  // namespace loom::worker
