// CUDA kernel benchmark: every op of the CUDA plugin against its libtorch reference (the
// reference_ops.h functions the registry falls back to) on CUDA tensors of a Llama-3-8B step
// (hidden 4096, MLP 14336, 32 / 8 heads of 128, vocabulary 128256), in bf16, rollout's paged
// decode attention and its norms on the 1B Llama's shapes (the attention against the gathered cache
// through SDPA, the residual add and norm against a torch add and the reference norm, the greedy
// pick against torch's argmax and the reference logprobs), plus the
// optimizer steps on fp32 parameters. Each side runs alternately on the default stream, timed per
// call with CUDA events; the table gives the median time and the bandwidth of the bytes the op
// must move (each input read once, each output written once), to compare with the card's copy
// rate.
//
// Usage: loom-bench-cuda-kernels [--plugin PATH] [--repeats 10] [--tokens 8192] [--only OP]
#include <ATen/ATen.h>
#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "kernels/loader.h"
#include "kernels/reference/reference_ops.h"
#include "bench/bench_stats.h"

namespace {

namespace ref = loom::kernels::reference;

struct Timer {
  cudaEvent_t start, stop;
  Timer() {
    cudaEventCreate(&start);
    cudaEventCreate(&stop);
  }
  ~Timer() {
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
  }
  double seconds(const std::function<void()>& fn) {
    cudaEventRecord(start, nullptr);
    fn();
    cudaEventRecord(stop, nullptr);
    cudaEventSynchronize(stop);
    float ms = 0.0f;
    cudaEventElapsedTime(&ms, start, stop);
    return ms * 1e-3;
  }
};

using loom::bench::median;

void require(int rc, const loom_kernel_table& t, const char* what) {
  if (rc == LOOM_KERNEL_OK) return;
  std::fprintf(stderr, "%s failed (%d): %s\n", what, rc, t.last_error ? t.last_error() : "");
  std::exit(1);
}

struct Bench {
  const loom_kernel_table& plugin;
  int repeats;
  std::string only;
  Timer timer;

  // One warm-up each, then `repeats` alternating timed calls; one table row.
  void run(const std::string& op, const std::string& shape, double bytes, const std::function<void()>& mine,
           const std::function<void()>& reference) {
    if (!only.empty() && op.find(only) == std::string::npos) return;
    mine();
    reference();
    std::vector<double> a, b;
    for (int i = 0; i < repeats; ++i) {
      a.push_back(timer.seconds(mine));
      b.push_back(timer.seconds(reference));
    }
    const double pa = median(a), pb = median(b);
    std::printf("| %s | %s | %.3f | %.0f | %.3f | %.0f | %.1fx |\n", op.c_str(), shape.c_str(), pa * 1e3,
                bytes / pa / 1e9, pb * 1e3, bytes / pb / 1e9, pb / pa);
    std::fflush(stdout);
  }
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"The CUDA kernel plugin's ops against their libtorch references"};
  std::string pluginPath = LOOM_CUDA_PLUGIN_PATH;
  int repeats = 10;
  int64_t tokens = 8192;
  std::string only;
  app.add_option("--plugin", pluginPath, "the plugin");
  app.add_option("--repeats", repeats, "timed calls of each side");
  app.add_option("--tokens", tokens, "rows of the layer ops (half that for the vocabulary ops)");
  app.add_option("--only", only, "ops whose name contains this");
  CLI11_PARSE(app, argc, argv);

  auto opened = loom::kernels::openPlugin(pluginPath, nullptr);
  if (!opened.isOk()) {
    std::fprintf(stderr, "%s\n", opened.status().message().c_str());
    return 1;
  }
  const loom_kernel_table& t = **opened;
  Bench bench{t, repeats, only, {}};
  at::manual_seed(0);
  const auto bf16 = at::TensorOptions().device(at::kCUDA).dtype(at::kBFloat16);
  const auto f32 = at::TensorOptions().device(at::kCUDA).dtype(at::kFloat);
  const loom_dtype dt = LOOM_DTYPE_BF16;
  constexpr double kB = 2.0;  // bytes per bf16 element

  std::printf("| op | shape | plugin ms | plugin GB/s | libtorch ms | libtorch GB/s | speedup |\n");
  std::printf("|---|---|---|---|---|---|---|\n");

  {  // RMSNorm over hidden 4096
    const int64_t rows = tokens, dim = 4096;
    const at::Tensor x = at::randn({rows, dim}, bf16), w = at::randn({dim}, bf16), dy = at::randn({rows, dim}, bf16);
    at::Tensor y = at::empty_like(x), dx = at::empty_like(x), rstd = at::empty({rows}, f32), dw = at::empty({dim}, f32);
    const std::string shape = fmt::format("[{}, {}] bf16", rows, dim);
    bench.run(
        "rms_norm_forward", shape, 2 * rows * dim * kB,
        [&] {
          require(t.rms_norm_forward(dt, x.data_ptr(), w.data_ptr(), y.data_ptr(), rstd.data_ptr<float>(), rows, dim,
                                     1e-5, nullptr),
                  t, "rms_norm_forward");
        },
        [&] { ref::rmsNormForward(x, w, 1e-5); });
    bench.run(
        "rms_norm_backward", shape, 3 * rows * dim * kB,
        [&] {
          require(t.rms_norm_backward(dt, x.data_ptr(), w.data_ptr(), dy.data_ptr(), rstd.data_ptr<float>(),
                                      dx.data_ptr(), dw.data_ptr<float>(), rows, dim, 1e-5, nullptr),
                  t, "rms_norm_backward");
        },
        [&] { ref::rmsNormBackward(x, w, dy, 1e-5); });
  }
  {  // Rollout's decode step on the 1B Llama: 256 rows of 2048, the norm alone and after the residual add
    const int64_t rows = 256, dim = 2048;
    const at::Tensor x = at::randn({rows, dim}, bf16), residual = at::randn({rows, dim}, bf16),
                     w = at::randn({dim}, bf16);
    at::Tensor sum = at::empty_like(x), y = at::empty_like(x);
    const std::string shape = fmt::format("[{}, {}] bf16", rows, dim);
    bench.run(
        "rms_norm_forward", shape, 2 * rows * dim * kB,
        [&] {
          require(t.rms_norm_forward(dt, x.data_ptr(), w.data_ptr(), y.data_ptr(), nullptr, rows, dim, 1e-5, nullptr),
                  t, "rms_norm_forward");
        },
        [&] { ref::rmsNormForward(x, w, 1e-5); });
    bench.run(
        "add_rms_norm", shape, 4 * rows * dim * kB,
        [&] {
          require(t.add_rms_norm(dt, x.data_ptr(), residual.data_ptr(), w.data_ptr(), sum.data_ptr(), y.data_ptr(),
                                 rows, dim, 1e-5, nullptr),
                  t, "add_rms_norm");
        },
        [&] { ref::rmsNormForward(x + residual, w, 1e-5); });
  }
  {  // RoPE on q [B, 32, S, 128], k [B, 8, S, 128], S 2048
    const int64_t seq = 2048, batch = std::max<int64_t>(1, tokens / seq), d = 128;
    at::Tensor q = at::randn({batch, 32, seq, d}, bf16), k = at::randn({batch, 8, seq, d}, bf16);
    const at::Tensor cos = at::randn({seq, d}, bf16), sin = at::randn({seq, d}, bf16);
    const double bytes = 2.0 * (q.numel() + k.numel()) * kB;
    const std::string shape = fmt::format("q [{}, 32, {}, {}] k 8 heads bf16", batch, seq, d);
    for (bool backward : {false, true})
      bench.run(
          backward ? "rope_backward" : "rope_forward", shape, bytes,
          [&] {
            auto fn = backward ? t.rope_backward : t.rope_forward;
            require(fn(dt, q.data_ptr(), k.data_ptr(), cos.data_ptr(), sin.data_ptr(), batch, 32, 8, seq, d, 0,
                       nullptr),
                    t, "rope");
          },
          [&] { backward ? ref::ropeBackward(q, k, cos, sin) : ref::ropeForward(q, k, cos, sin); });
  }
  {  // SwiGLU over the MLP's 14336
    const int64_t n = tokens * 14336;
    const at::Tensor gate = at::randn({n}, bf16), up = at::randn({n}, bf16), dout = at::randn({n}, bf16);
    at::Tensor out = at::empty_like(gate), dg = at::empty_like(gate), du = at::empty_like(gate);
    const std::string shape = fmt::format("[{}, 14336] bf16", tokens);
    bench.run(
        "swiglu_forward", shape, 3.0 * n * kB,
        [&] {
          require(t.swiglu_forward(dt, gate.data_ptr(), up.data_ptr(), out.data_ptr(), n, nullptr), t, "swiglu");
        },
        [&] { ref::swigluForward(gate, up); });
    bench.run(
        "swiglu_backward", shape, 5.0 * n * kB,
        [&] {
          require(t.swiglu_backward(dt, gate.data_ptr(), up.data_ptr(), dout.data_ptr(), dg.data_ptr(), du.data_ptr(),
                                    n, nullptr),
                  t, "swiglu_backward");
        },
        [&] { ref::swigluBackward(gate, up, dout); });
  }
  {  // Over the vocabulary 128256
    const int64_t rows = std::max<int64_t>(1, tokens / 2), vocab = 128256;
    const at::Tensor logits = at::randn({rows, vocab}, bf16) * 3, other = at::randn({rows, vocab}, bf16);
    const at::Tensor labels = at::randint(vocab, {rows}, f32.dtype(at::kLong));
    const at::Tensor dloss = at::randn({rows}, f32);
    at::Tensor loss = at::empty({rows}, f32), lse = at::empty({rows}, f32), d = at::empty_like(logits);
    const double row = static_cast<double>(rows) * vocab * kB;
    const std::string shape = fmt::format("[{}, {}] bf16", rows, vocab);
    bench.run(
        "cross_entropy_forward", shape, row,
        [&] {
          require(t.cross_entropy_forward(dt, logits.data_ptr(), labels.data_ptr<int64_t>(), rows, vocab, -100,
                                          loss.data_ptr<float>(), lse.data_ptr<float>(), nullptr),
                  t, "cross_entropy_forward");
        },
        [&] { ref::crossEntropyForward(logits, labels, -100); });
    bench.run(
        "cross_entropy_backward", shape, 2 * row,
        [&] {
          require(t.cross_entropy_backward(dt, logits.data_ptr(), labels.data_ptr<int64_t>(), lse.data_ptr<float>(),
                                           dloss.data_ptr<float>(), d.data_ptr(), rows, vocab, -100, nullptr),
                  t, "cross_entropy_backward");
        },
        [&] { ref::crossEntropyBackward(logits, labels, dloss, -100); });
    bench.run(
        "logprobs", shape, row,
        [&] {
          require(t.logprobs(dt, logits.data_ptr(), labels.data_ptr<int64_t>(), rows, vocab, loss.data_ptr<float>(),
                             nullptr),
                  t, "logprobs");
        },
        [&] { ref::logprobs(logits, labels); });
    bench.run(
        "entropy", shape, row,
        [&] { require(t.entropy(dt, logits.data_ptr(), rows, vocab, loss.data_ptr<float>(), nullptr), t, "entropy"); },
        [&] { ref::entropy(logits); });
    bench.run(
        "kl_divergence", shape, 2 * row,
        [&] {
          require(t.kl_divergence(dt, logits.data_ptr(), other.data_ptr(), rows, vocab, loss.data_ptr<float>(),
                                  nullptr),
                  t, "kl_divergence");
        },
        [&] { ref::klDivergence(logits, other); });
  }
  {  // Greedy decoding's pick and logprob on the 1B Llama's decode step: 256 rows of its vocabulary
    const int64_t rows = 256, vocab = 128256;
    const at::Tensor logits = at::randn({rows, vocab}, bf16);
    at::Tensor tokens = at::empty({rows}, f32.dtype(at::kLong)), chosen = at::empty({rows}, f32);
    bench.run(
        "greedy_logprobs", fmt::format("[{}, {}] bf16", rows, vocab), rows * vocab * kB,
        [&] {
          require(t.greedy_logprobs(dt, logits.data_ptr(), rows, vocab, tokens.data_ptr<int64_t>(),
                                    chosen.data_ptr<float>(), nullptr),
                  t, "greedy_logprobs");
        },
        [&] { ref::logprobs(logits, logits.argmax(-1)); });
  }
  // Rollout's decode attention over a paged cache of 16-position blocks, scattered, 32 query heads
  // over 8 KV heads of 64 (the 1B Llama): the rollout benchmark's 256 sequences of 128 to 384
  // positions, then fewer and longer sequences (fewer blocks of the kernel, each longer-lived).
  struct Contexts {
    int64_t seqs, shortest, longest;
  };
  for (const Contexts& c : {Contexts{256, 128, 384}, Contexts{64, 1024, 1024}, Contexts{16, 4096, 4096}}) {
    const int64_t seqs = c.seqs, heads = 32, kvHeads = 8, dim = 64, blockSize = 16, longest = c.longest;
    const int64_t maxBlocks = longest / blockSize, numBlocks = seqs * maxBlocks;
    const at::Tensor lengths = at::randint(c.shortest, longest + 1, {seqs}, f32.dtype(at::kLong));
    const at::Tensor tables = at::randperm(numBlocks, f32.dtype(at::kLong)).view({seqs, maxBlocks});
    const at::Tensor keys = at::randn({numBlocks, blockSize, kvHeads, dim}, bf16);
    const at::Tensor values = at::randn({numBlocks, blockSize, kvHeads, dim}, bf16);
    const at::Tensor q = at::randn({seqs, heads, dim}, bf16);
    at::Tensor out = at::empty_like(q);
    const double scale = 1.0 / std::sqrt(static_cast<double>(dim));
    // The bytes it must read: each sequence's keys and values once.
    const double bytes = 2.0 * lengths.sum().item<double>() * kvHeads * dim * kB;
    // The reference: each sequence's blocks gathered into a dense cache, masked past its length.
    const at::Tensor mask = at::arange(longest, f32.dtype(at::kLong)).unsqueeze(0) < lengths.unsqueeze(1);
    const at::Tensor allowed = mask.view({seqs, 1, 1, longest});
    auto gathered = [&](const at::Tensor& cache) {
      return cache.index_select(0, tables.flatten()).view({seqs, longest, kvHeads, dim}).transpose(1, 2);
    };
    bench.run(
        "paged_attention_decode",
        fmt::format("{} seqs x {}-{} positions, {}/{} heads of {} bf16", seqs, c.shortest, longest, heads, kvHeads,
                    dim),
        bytes,
        [&] {
          require(t.paged_attention_decode(dt, q.data_ptr(), keys.data_ptr(), values.data_ptr(),
                                           tables.data_ptr<int64_t>(), lengths.data_ptr<int64_t>(), out.data_ptr(),
                                           seqs, heads, kvHeads, dim, blockSize, maxBlocks, scale, 0, nullptr),
                  t, "paged_attention_decode");
        },
        [&] {
          at::scaled_dot_product_attention(q.unsqueeze(2), gathered(keys), gathered(values), allowed, 0.0, false,
                                           scale, /*enable_gqa=*/true);
        });
  }
  {  // Optimizer steps on 2^28 fp32 parameters
    const int64_t n = 1ll << 28;
    at::Tensor p = at::randn({n}, f32), g = at::randn({n}, f32), m = at::zeros({n}, f32), v = at::zeros({n}, f32);
    const std::string shape = fmt::format("{}M fp32", n >> 20);
    const loom_adam_config adam{.lr = 1e-4,
                                .beta1 = 0.9,
                                .beta2 = 0.95,
                                .eps = 1e-8,
                                .weight_decay = 0.1,
                                .step = 10,
                                .bias_correction = 1,
                                .decoupled_weight_decay = 1};
    bench.run(
        "adamw_step", shape, 7.0 * n * 4,
        [&] {
          require(t.adamw_step(&adam, LOOM_DTYPE_F32, p.data_ptr(), LOOM_DTYPE_F32, g.data_ptr(), m.data_ptr<float>(),
                               v.data_ptr<float>(), n, nullptr),
                  t, "adamw_step");
        },
        [&] { ref::adamStep(adam, p, g, m, v); });
    const loom_lion_config lion{.lr = 1e-5, .beta1 = 0.9, .beta2 = 0.99, .weight_decay = 0.1};
    bench.run(
        "lion_step", shape, 5.0 * n * 4,
        [&] {
          require(t.lion_step(&lion, LOOM_DTYPE_F32, p.data_ptr(), LOOM_DTYPE_F32, g.data_ptr(), m.data_ptr<float>(),
                              n, nullptr),
                  t, "lion_step");
        },
        [&] { ref::lionStep(lion, p, g, m); });
    const loom_adagrad_config adagrad{.lr = 1e-3, .eps = 1e-10, .weight_decay = 0.0};
    bench.run(
        "adagrad_step", shape, 5.0 * n * 4,
        [&] {
          require(t.adagrad_step(&adagrad, LOOM_DTYPE_F32, p.data_ptr(), LOOM_DTYPE_F32, g.data_ptr(),
                                 v.data_ptr<float>(), n, nullptr),
                  t, "adagrad_step");
        },
        [&] { ref::adagradStep(adagrad, p, g, v); });
  }
  return 0;
}
