// The losses over the vocabulary on one H200 at tp 1: Loom's vocabulary-parallel cross entropy
// (worker/torch/parallel/vocab_parallel.h, in blocks of rows, on a group of one rank) against the
// CUDA plugin's fused cross entropy (the op a one-rank model runs) and the unchunked loss
// (at::cross_entropy_loss on the logits cast to fp32, as Hugging Face's ForCausalLMLoss does), on
// bf16 logits of one sequence (default 4096 tokens, Llama-3's 128,256-token vocabulary). Each is
// one forward and backward (the gradient of the mean written in bf16), timed with CUDA events
// (median of --repeats), and its peak memory above the logits and labels it was given.
//
// Usage: loom-bench-cuda-losses [--plugin PATH] [--tokens 4096] [--vocab 128256] [--repeats 10]
//                               [--block-rows 0]
#include <ATen/ATen.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <cuda_runtime_api.h>
#include <torch/csrc/autograd/autograd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <functional>
#include <vector>

#include "backends/self_communicator.h"
#include "kernels/loader.h"
#include "worker/torch/parallel/vocab_parallel.h"

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int64_t allocatedNow() {
  return c10::cuda::CUDACachingAllocator::getDeviceStats(0).allocated_bytes[0].current;
}
int64_t allocatedPeak() { return c10::cuda::CUDACachingAllocator::getDeviceStats(0).allocated_bytes[0].peak; }

// Median seconds of `fn` over `repeats` timed calls after one warm-up, and its peak memory above
// what was allocated before it.
std::pair<double, int64_t> measure(int repeats, const std::function<void()>& fn) {
  fn();
  cudaDeviceSynchronize();
  const int64_t before = allocatedNow();
  c10::cuda::CUDACachingAllocator::resetPeakStats(0);
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  std::vector<double> times;
  for (int i = 0; i < repeats; ++i) {
    cudaEventRecord(start, nullptr);
    fn();
    cudaEventRecord(stop, nullptr);
    cudaEventSynchronize(stop);
    float ms = 0;
    cudaEventElapsedTime(&ms, start, stop);
    times.push_back(ms * 1e-3);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return {median(times), allocatedPeak() - before};
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Loom's blocked vocabulary-parallel cross entropy against the fused and the unchunked one"};
  std::string pluginPath = LOOM_CUDA_PLUGIN_PATH;
  int64_t tokens = 4096, vocab = 128256, blockRows = 0;
  int repeats = 10;
  app.add_option("--plugin", pluginPath, "the CUDA kernel plugin");
  app.add_option("--tokens", tokens, "rows of logits");
  app.add_option("--vocab", vocab, "columns of logits");
  app.add_option("--repeats", repeats, "timed calls of each");
  app.add_option("--block-rows", blockRows, "rows per block of Loom's loss (0: rows of at most 2^24 logits)");
  CLI11_PARSE(app, argc, argv);
  auto opened = loom::kernels::openPlugin(pluginPath, nullptr);
  if (!opened.isOk()) {
    std::fprintf(stderr, "%s\n", opened.status().message().c_str());
    return 1;
  }
  const loom_kernel_table& t = **opened;

  at::manual_seed(0);
  const auto bf16 = at::TensorOptions().device(at::kCUDA).dtype(at::kBFloat16);
  const auto f32 = at::TensorOptions().device(at::kCUDA).dtype(at::kFloat);
  const at::Tensor logits = at::randn({tokens, vocab}, bf16);
  const at::Tensor labels = at::randint(0, vocab, {tokens}, at::TensorOptions().device(at::kCUDA).dtype(at::kLong));
  const double logitBytes = static_cast<double>(logits.numel() * logits.element_size());
  loom::backends::SelfCommunicator one("tensor");
  const loom::worker::VocabShard shard{.tp = &one, .vocabStart = 0, .blockRows = blockRows};

  auto autogradLoss = [&](auto&& loss) {
    return [&, loss] {
      at::Tensor x = logits.detach().requires_grad_(true);
      at::Tensor l = loss(x);
      torch::autograd::backward({l});
    };
  };
  const auto blocked = measure(repeats, autogradLoss([&](const at::Tensor& x) {
    return loom::worker::vocabParallelCrossEntropy(x, labels, shard);
  }));
  const auto unchunked = measure(repeats, autogradLoss([&](const at::Tensor& x) {
    return at::cross_entropy_loss(x.to(at::kFloat), labels);
  }));
  const auto fused = measure(repeats, [&] {
    at::Tensor loss = at::empty({tokens}, f32), lse = at::empty({tokens}, f32), grad = at::empty_like(logits);
    at::Tensor dloss = at::full({tokens}, 1.0 / static_cast<double>(tokens), f32);
    t.cross_entropy_forward(LOOM_DTYPE_BF16, logits.data_ptr(), labels.data_ptr<int64_t>(), tokens, vocab, -100,
                            loss.data_ptr<float>(), lse.data_ptr<float>(), nullptr);
    (void)loss.mean();
    t.cross_entropy_backward(LOOM_DTYPE_BF16, logits.data_ptr(), labels.data_ptr<int64_t>(), lse.data_ptr<float>(),
                             dloss.data_ptr<float>(), grad.data_ptr(), tokens, vocab, -100, nullptr);
  });

  std::printf("cross entropy over [%lld, %lld] bf16 logits (%.2f GiB), forward + backward:\n",
              static_cast<long long>(tokens), static_cast<long long>(vocab), logitBytes / (1 << 30));
  std::printf("| loss | ms | vs fused | peak memory above the logits | of the logits' bytes |\n|---|---|---|---|---|\n");
  auto row = [&](const char* name, const std::pair<double, int64_t>& r) {
    std::printf("| %s | %.3f | %.2fx | %.2f GiB | %.2fx |\n", name, r.first * 1e3, r.first / fused.first,
                static_cast<double>(r.second) / (1 << 30), static_cast<double>(r.second) / logitBytes);
  };
  row("CUDA plugin, fused (one rank's default)", fused);
  row("Loom vocabulary-parallel, blocked, tp 1", blocked);
  row("unchunked: cross_entropy on fp32 logits", unchunked);
  return 0;
}
