// Kernel benchmark: every op of the CPU plugin against its libtorch reference (the functions the
// registry falls back to, which are the worker's current layers and optimizer formulas), on shapes
// of a small Llama's step, in fp32 and bf16. The two sides alternate run by run (the machine is
// shared, so its speed drifts) and each reports the median. First, the AdamW step on 100M fp32
// parameters against the memory-traffic floors (adamFloors); the same step against torch.optim and
// DeepSpeedCPUAdam is bench/kernels/adamw_bench.py.
//
// Usage: loom-bench-kernels [--plugin PATH] [--repeats 7] [--own-threads] [--only OP]
//                           [--adam-params 100000000] [--cold-heap] [--json FILE]
// The plugin runs on libtorch's threads (at::parallel_for, as the worker hands them to it) unless
// --own-threads; either way as many as libtorch uses (at::get_num_threads()).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <fmt/format.h>
#include <immintrin.h>
#include <malloc.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <thread>
#include <vector>

#include "kernels/loader.h"
#include "kernels/reference/reference_ops.h"
#include "kernels/reference/reference_table.h"
#include "bench/bench_stats.h"

namespace {

using Clock = std::chrono::steady_clock;
namespace ref = loom::kernels::reference;

double seconds(const std::function<void()>& fn) {
  const auto start = Clock::now();
  fn();
  return std::chrono::duration<double>(Clock::now() - start).count();
}

using loom::bench::median;

// The plugin and the reference alternately, one warm-up each, then `repeats` timed runs each:
// the two medians.
std::pair<double, double> timePair(int repeats, const std::function<void()>& plugin,
                                   const std::function<void()>& reference) {
  plugin();
  reference();
  std::vector<double> a, b;
  for (int i = 0; i < repeats; ++i) {
    a.push_back(seconds(plugin));
    b.push_back(seconds(reference));
  }
  return {median(a), median(b)};
}

void require(int rc, const loom_kernel_table& t, const char* what) {
  if (rc == LOOM_KERNEL_OK) return;
  std::fprintf(stderr, "%s failed (%d): %s\n", what, rc, t.last_error ? t.last_error() : "");
  std::exit(1);
}

// On `threads` threads of our own, each over its contiguous share of [0, n).
void onThreads(int threads, int64_t n, const std::function<void(int64_t, int64_t)>& fn) {
  std::vector<std::thread> pool;
  for (int i = 0; i < threads; ++i)
    pool.emplace_back(
        [&, i] { fn(n * i / threads / 16 * 16, i + 1 == threads ? n : n * (i + 1) / threads / 16 * 16); });
  for (auto& t : pool) t.join();
}

// The traffic of an AdamW step without its arithmetic: read p, g, m, v, write p, m, v (SSE, which
// any x86-64 has and which saturates memory as well as wider vectors do).
void streamPattern(float* p, const float* g, float* m, float* v, int64_t begin, int64_t end) {
  for (int64_t i = begin; i < end; i += 4) {
    const __m128 gv = _mm_loadu_ps(g + i);
    _mm_storeu_ps(p + i, _mm_add_ps(_mm_loadu_ps(p + i), gv));
    _mm_storeu_ps(m + i, _mm_add_ps(_mm_loadu_ps(m + i), gv));
    _mm_storeu_ps(v + i, _mm_add_ps(_mm_loadu_ps(v + i), gv));
  }
}

// AdamW on n fp32 parameters against two floors, in interleaved rounds: the 28 bytes per
// parameter at the copy bandwidth (glibc memcpy of 1 GiB on `threads` threads, read + write
// counted), and the same 4-read / 3-write streams with no arithmetic (the floor of this access
// pattern, which streams more than a copy's 1 read / 1 write do). Prints the medians of per-round
// ratios.
void adamFloors(const loom_kernel_table& k, int64_t n, int threads, int repeats) {
  at::Tensor p = at::randn({n}), g = at::randn({n}), m = at::zeros({n}), v = at::zeros({n});
  const size_t bytes = size_t{1} << 30;
  std::vector<char> src(bytes, 1), dst(bytes, 0);
  loom_adam_config adam{.lr = 1e-3,
                        .beta1 = 0.9,
                        .beta2 = 0.999,
                        .eps = 1e-8,
                        .weight_decay = 0.01,
                        .step = 0,
                        .bias_correction = 1,
                        .decoupled_weight_decay = 1};
  auto step = [&] {
    ++adam.step;
    require(k.adamw_step(&adam, LOOM_DTYPE_F32, p.data_ptr(), LOOM_DTYPE_F32, g.data_ptr(), m.data_ptr<float>(),
                         v.data_ptr<float>(), n, nullptr),
            k, "adamw");
  };
  std::vector<double> copyBw, patternBw, adamBw, ofCopyFloor, ofPattern;
  for (int r = 0; r <= repeats; ++r) {  // round 0 warms up
    const double c = 2.0 * static_cast<double>(bytes) / seconds([&] {
                       onThreads(threads, static_cast<int64_t>(bytes),
                                 [&](int64_t b, int64_t e) { std::memcpy(dst.data() + b, src.data() + b, e - b); });
                     });
    const double pt =
        28.0 * static_cast<double>(n) / seconds([&] {
          onThreads(threads, n, [&](int64_t b, int64_t e) {
            streamPattern(p.data_ptr<float>(), g.data_ptr<float>(), m.data_ptr<float>(), v.data_ptr<float>(), b, e);
          });
        });
    m.zero_();
    v.zero_();
    const double a = 28.0 * static_cast<double>(n) / seconds(step);
    if (r == 0) continue;
    copyBw.push_back(c);
    patternBw.push_back(pt);
    adamBw.push_back(a);
    ofCopyFloor.push_back(a / c);
    ofPattern.push_back(a / pt);
  }
  std::printf("\nAdamW step, %.0fM fp32 parameters, %d threads, %d interleaved rounds (medians):\n",
              static_cast<double>(n) / 1e6, threads, repeats);
  std::printf("| | GB/s (28 B/param for the step) |\n|---|---|\n");
  std::printf("| copy bandwidth (memcpy, read + write) | %.1f |\n", median(copyBw) / 1e9);
  std::printf("| AdamW's streams without arithmetic | %.1f |\n", median(patternBw) / 1e9);
  std::printf("| Loom cpu plugin AdamW | %.1f |\n", median(adamBw) / 1e9);
  std::printf("plugin: %.0f%% of the floor at the copy bandwidth, %.0f%% of the access-pattern floor\n",
              100.0 * median(ofCopyFloor), 100.0 * median(ofPattern));
}

struct Row {
  std::string op, shape;
  double plugin = 0, reference = 0;
};

at::ScalarType scalar(loom_dtype d) { return d == LOOM_DTYPE_BF16 ? at::kBFloat16 : at::kFloat; }
const char* name(loom_dtype d) { return d == LOOM_DTYPE_BF16 ? "bf16" : "fp32"; }

std::vector<Row> benchOps(const loom_kernel_table& k, int repeats, const std::string& only) {
  std::vector<Row> rows;
  auto add = [&](std::string op, std::string shape, const std::function<void()>& plugin,
                 const std::function<void()>& reference) {
    if (!only.empty() && op.find(only) == std::string::npos) return;
    auto [p, r] = timePair(repeats, plugin, reference);
    rows.push_back({std::move(op), std::move(shape), p, r});
    std::fprintf(stderr, "%s %s: %.2f ms / %.2f ms\n", rows.back().op.c_str(), rows.back().shape.c_str(), p * 1e3,
                 r * 1e3);
  };
  for (loom_dtype dt : {LOOM_DTYPE_F32, LOOM_DTYPE_BF16}) {
    const auto opt = at::TensorOptions().dtype(scalar(dt));
    {  // RMSNorm: 4096 tokens x 2048
      const int64_t n = 4096, d = 2048;
      at::Tensor x = at::randn({n, d}).to(opt), w = at::randn({d}).to(opt), dy = at::randn({n, d}).to(opt);
      at::Tensor y = at::empty_like(x), dx = at::empty_like(x), rstd = at::empty({n}), dw = at::empty({d});
      const std::string shape = fmt::format("{} [{}, {}]", name(dt), n, d);
      add(
          "rms_norm_forward", shape,
          [&] {
            require(k.rms_norm_forward(dt, x.data_ptr(), w.data_ptr(), y.data_ptr(), rstd.data_ptr<float>(), n, d, 1e-6,
                                       nullptr),
                    k, "rms_norm");
          },
          [&] { ref::rmsNormForward(x, w, 1e-6); });
      add(
          "rms_norm_backward", shape,
          [&] {
            require(k.rms_norm_backward(dt, x.data_ptr(), w.data_ptr(), dy.data_ptr(), rstd.data_ptr<float>(),
                                        dx.data_ptr(), dw.data_ptr<float>(), n, d, 1e-6, nullptr),
                    k, "rms_norm_backward");
          },
          [&] { ref::rmsNormBackward(x, w, dy, 1e-6); });
    }
    {  // RoPE: q [1, 32, 2048, 128], k [1, 8, 2048, 128]
      const int64_t s = 2048, d = 128, hq = 32, hk = 8;
      at::Tensor q = at::randn({1, hq, s, d}).to(opt), kk = at::randn({1, hk, s, d}).to(opt);
      at::Tensor cos = at::randn({s, d}).to(opt), sin = at::randn({s, d}).to(opt);
      add(
          "rope_forward", fmt::format("{} q [1, {}, {}, {}] k {} heads", name(dt), hq, s, d, hk),
          [&] {
            require(k.rope_forward(dt, q.data_ptr(), kk.data_ptr(), cos.data_ptr(), sin.data_ptr(), 1, hq, hk, s, d, 0,
                                   nullptr),
                    k, "rope");
          },
          [&] { ref::ropeForward(q, kk, cos, sin); });
    }
    {  // SwiGLU: 2048 tokens x 5632
      const int64_t n = 2048 * 5632;
      at::Tensor g = at::randn({n}).to(opt), u = at::randn({n}).to(opt), dy = at::randn({n}).to(opt);
      at::Tensor out = at::empty_like(g), dg = at::empty_like(g), du = at::empty_like(g);
      const std::string shape = fmt::format("{} [2048 x 5632]", name(dt));
      add(
          "swiglu_forward", shape,
          [&] { require(k.swiglu_forward(dt, g.data_ptr(), u.data_ptr(), out.data_ptr(), n, nullptr), k, "swiglu"); },
          [&] { ref::swigluForward(g, u); });
      add(
          "swiglu_backward", shape,
          [&] {
            require(k.swiglu_backward(dt, g.data_ptr(), u.data_ptr(), dy.data_ptr(), dg.data_ptr(), du.data_ptr(), n,
                                      nullptr),
                    k, "swiglu_backward");
          },
          [&] { ref::swigluBackward(g, u, dy); });
    }
    {  // Over a 32000-token vocabulary, 2048 rows.
      const int64_t n = 2048, v = 32000;
      at::Tensor logits = (at::randn({n, v}) * 3).to(opt), other = (at::randn({n, v}) * 3).to(opt);
      at::Tensor labels = at::randint(v, {n}, at::kLong), dloss = at::randn({n});
      at::Tensor loss = at::empty({n}), lse = at::empty({n}), dlogits = at::empty_like(logits), out = at::empty({n});
      const std::string shape = fmt::format("{} [{}, {}]", name(dt), n, v);
      add(
          "cross_entropy_forward", shape,
          [&] {
            require(k.cross_entropy_forward(dt, logits.data_ptr(), labels.data_ptr<int64_t>(), n, v, -100,
                                            loss.data_ptr<float>(), lse.data_ptr<float>(), nullptr),
                    k, "cross_entropy");
          },
          [&] { ref::crossEntropyForward(logits, labels, -100); });
      add(
          "cross_entropy_backward", shape,
          [&] {
            require(k.cross_entropy_backward(dt, logits.data_ptr(), labels.data_ptr<int64_t>(), lse.data_ptr<float>(),
                                             dloss.data_ptr<float>(), dlogits.data_ptr(), n, v, -100, nullptr),
                    k, "ce_backward");
          },
          [&] { ref::crossEntropyBackward(logits, labels, dloss, -100); });
      add(
          "logprobs", shape,
          [&] {
            require(k.logprobs(dt, logits.data_ptr(), labels.data_ptr<int64_t>(), n, v, out.data_ptr<float>(), nullptr),
                    k, "logprobs");
          },
          [&] { ref::logprobs(logits, labels); });
      add(
          "entropy", shape,
          [&] { require(k.entropy(dt, logits.data_ptr(), n, v, out.data_ptr<float>(), nullptr), k, "entropy"); },
          [&] { ref::entropy(logits); });
      add(
          "kl_divergence", shape,
          [&] {
            require(k.kl_divergence(dt, logits.data_ptr(), other.data_ptr(), n, v, out.data_ptr<float>(), nullptr), k,
                    "kl");
          },
          [&] { ref::klDivergence(logits, other); });
    }
    {  // Optimizer steps on 10M parameters (fp32 state).
      const int64_t n = 10'000'000;
      at::Tensor p = at::randn({n}).to(opt), g = at::randn({n}).to(opt), m = at::zeros({n}), v = at::zeros({n});
      const std::string shape = fmt::format("{} param+grad, {}M", name(dt), n / 1'000'000);
      loom_adam_config adam{.lr = 1e-3,
                            .beta1 = 0.9,
                            .beta2 = 0.999,
                            .eps = 1e-8,
                            .weight_decay = 0.01,
                            .step = 1,
                            .bias_correction = 1,
                            .decoupled_weight_decay = 1};
      add(
          "adamw_step", shape,
          [&] {
            require(k.adamw_step(&adam, dt, p.data_ptr(), dt, g.data_ptr(), m.data_ptr<float>(), v.data_ptr<float>(), n,
                                 nullptr),
                    k, "adamw");
          },
          [&] { ref::adamStep(adam, p, g, m, v); });
      loom_lion_config lion{.lr = 1e-4, .beta1 = 0.9, .beta2 = 0.99, .weight_decay = 0.01};
      add(
          "lion_step", shape,
          [&] {
            require(k.lion_step(&lion, dt, p.data_ptr(), dt, g.data_ptr(), m.data_ptr<float>(), n, nullptr), k, "lion");
          },
          [&] { ref::lionStep(lion, p, g, m); });
      loom_adagrad_config adagrad{.lr = 1e-2, .eps = 1e-10, .weight_decay = 0.01};
      add(
          "adagrad_step", shape,
          [&] {
            require(k.adagrad_step(&adagrad, dt, p.data_ptr(), dt, g.data_ptr(), m.data_ptr<float>(), n, nullptr), k,
                    "adagrad");
          },
          [&] { ref::adagradStep(adagrad, p, g, m); });
    }
  }
  return rows;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Loom kernel benchmark: the CPU plugin against the libtorch reference"};
  std::string plugin = LOOM_CPU_PLUGIN_PATH, jsonPath, only;
  int repeats = 7;
  bool ownThreads = false;
  app.add_option("--plugin", plugin, "the plugin to measure");
  app.add_option("--repeats", repeats, "timed runs of each side per op (the medians are reported)");
  app.add_flag("--own-threads", ownThreads, "the plugin on its own thread pool instead of libtorch's threads");
  app.add_option("--json", jsonPath, "also write the numbers as JSON");
  app.add_option("--only", only, "only the ops whose name contains this");
  bool coldHeap = false;
  app.add_flag("--cold-heap", coldHeap,
               "leave glibc's heap as it is: each large temporary of the reference is a fresh mmap that "
               "page-faults on first touch (as in the worker today)");
  int64_t adamParams = 100'000'000;
  app.add_option("--adam-params", adamParams, "parameters of the AdamW step against the floors (0: skip)");
  CLI11_PARSE(app, argc, argv);

  if (!coldHeap) {
    // Kernel against kernel: keep freed memory in the heap (no mmap per large block, no trim), so
    // the reference's temporaries do not page-fault afresh on every call.
    mallopt(M_MMAP_MAX, 0);
    mallopt(M_TRIM_THRESHOLD, -1);
  }
  const int threads = at::get_num_threads();
  loom_kernel_host host = ownThreads ? loom_kernel_host{.struct_size = sizeof(loom_kernel_host), .num_threads = threads}
                                     : ref::atenKernelHost();
  auto opened = loom::kernels::openPlugin(plugin, &host);
  if (!opened.isOk()) {
    std::fprintf(stderr, "%s\n", opened.status().message().c_str());
    return 1;
  }
  const loom_kernel_table& k = **opened;
  std::printf("plugin %s [%s], %d threads (%s); medians of %d runs; %s heap\n", k.name, k.isa, threads,
              ownThreads ? "its own" : "libtorch's", repeats, coldHeap ? "cold (glibc's defaults)" : "warm");

  if (adamParams > 0) adamFloors(k, adamParams, threads, repeats);
  const std::vector<Row> rows = benchOps(k, repeats, only);
  std::printf("\n| op | shape | plugin ms | libtorch reference ms | speedup |\n|---|---|---|---|---|\n");
  for (const Row& r : rows)
    std::printf("| %s | %s | %.2f | %.2f | %.1fx |\n", r.op.c_str(), r.shape.c_str(), r.plugin * 1e3, r.reference * 1e3,
                r.reference / r.plugin);

  if (!jsonPath.empty()) {
    std::string json =
        fmt::format(R"({{"isa": "{}", "threads": {}, "own_threads": {}, "ops": [)", k.isa, threads, ownThreads);
    for (size_t i = 0; i < rows.size(); ++i)
      json += fmt::format(R"({}{{"op": "{}", "shape": "{}", "plugin_s": {}, "reference_s": {}}})", i ? ", " : "",
                          rows[i].op, rows[i].shape, rows[i].plugin, rows[i].reference);
    json += "]}\n";
    std::ofstream(jsonPath) << json;
  }
  return 0;
}
