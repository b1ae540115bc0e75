/* The kernel plugin ABI: plain C, no torch.
 *
 * A plugin is a shared library exporting one symbol, `loom_kernel_plugin`, that returns a pointer
 * to a `loom_kernel_table`: a versioned struct of function pointers for one device. The loader
 * (kernels/loader.h) reads `abi_version` first and refuses a library whose version differs from
 * LOOM_KERNEL_ABI_VERSION, naming the file and both versions. Slots may be appended to the end
 * of the table without a version change: `struct_size` says how many the plugin knows, and a
 * slot past it, or NULL, is "not provided". Every slot marked (optional) may be NULL; every op
 * slot is optional (the libtorch reference provides them all).
 *
 * Conventions of every op:
 * - Tensors are raw pointers to contiguous row-major memory; sizes are element counts.
 * - `loom_dtype` names the element type of the tensors it covers; statistics (rstd, lse, losses),
 *   optimizer state and dweight are always fp32.
 * - The return value is a `loom_status`. LOOM_KERNEL_UNSUPPORTED means "this implementation does
 *   not take this call" (a dtype, an option such as amsgrad): it is returned before any output
 *   is written, and the registry then offers the call to the next implementation.
 *   `last_error` (when provided) says why, for the calling thread.
 * - `stream` is the device stream (cudaStream_t on "cuda"); NULL on "cpu".
 * - Ops may be called from several threads at once; `init` may not run concurrently with ops.
 */
#ifndef LOOM_KERNEL_ABI_H
#define LOOM_KERNEL_ABI_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define LOOM_KERNEL_ABI_VERSION 1u
#define LOOM_KERNEL_ENTRY_SYMBOL "loom_kernel_plugin"

typedef enum loom_dtype {
  LOOM_DTYPE_F32 = 0,
  LOOM_DTYPE_BF16 = 1,
} loom_dtype;

typedef enum loom_status {
  LOOM_KERNEL_OK = 0,
  LOOM_KERNEL_UNSUPPORTED = 1,      /* not this implementation: try the next one */
  LOOM_KERNEL_INVALID_ARGUMENT = 2, /* the call is wrong (a label out of range, a NULL tensor) */
  LOOM_KERNEL_INTERNAL = 3,
} loom_status;

/* What the host offers a plugin at init. */
typedef void (*loom_range_fn)(void* fn_ctx, int64_t begin, int64_t end);
typedef struct loom_kernel_host {
  uint32_t struct_size; /* sizeof(loom_kernel_host) */
  int32_t num_threads;  /* threads the plugin may use; 0: as many as the machine has */
  /* (optional) the highest instruction set the plugin may use ("scalar", "avx2", "avx512" on
   * cpu); NULL: the best the processor has. */
  const char* isa;
  /* (optional) runs fn over [0, n) split into ranges of at least `grain` elements on the host's
   * threads, returning when every range is done (e.g. at::parallel_for). NULL: the plugin runs
   * on threads of its own. */
  void (*parallel_for)(void* host_ctx, int64_t n, int64_t grain, loom_range_fn fn, void* fn_ctx);
  void* host_ctx;
} loom_kernel_host;

/* Adam / AdamW (torch.optim.AdamW and Adam's formulas, fp32 math whatever the param dtype).
 * Scalars are double as the host computes them; kernels round them to fp32 where torch does. */
typedef struct loom_adam_config {
  double lr, beta1, beta2, eps, weight_decay;
  int64_t step;                   /* this update's number, counted from 1 */
  int32_t bias_correction;        /* 1: divide the moments by 1 - beta^step */
  int32_t decoupled_weight_decay; /* 1: AdamW, p *= 1 - lr * wd; 0: Adam with L2, g += wd * p */
  int32_t amsgrad;                /* not supported: every implementation refuses 1 (UNSUPPORTED) */
} loom_adam_config;

/* Lion: c = b1 m + (1 - b1) g; p = p (1 - lr wd) - lr sign(c); m = b2 m + (1 - b2) g. */
typedef struct loom_lion_config {
  double lr, beta1, beta2, weight_decay;
} loom_lion_config;

/* Adagrad (torch.optim.Adagrad, lr_decay 0, initial accumulator 0): g += wd p (L2);
 * s += g^2; p -= lr g / (sqrt(s) + eps). */
typedef struct loom_adagrad_config {
  double lr, eps, weight_decay;
} loom_adagrad_config;

typedef struct loom_kernel_table {
  uint32_t abi_version; /* LOOM_KERNEL_ABI_VERSION; the first field in every version */
  uint32_t struct_size; /* sizeof(loom_kernel_table) as the plugin was compiled */
  const char* name;     /* "loom-cpu" */
  const char* device;   /* "cpu" or "cuda" */
  const char* isa;      /* what it runs on now ("avx512", "avx2", "scalar", "sm_90"); set by init */

  /* (optional) configures the plugin; may be called again to change the settings. The loader
   * calls it once before any op. NULL host: defaults. The plugin copies what it needs from
   * `host` (host_ctx must stay valid while the plugin is in use). */
  int (*init)(const loom_kernel_host* host);
  /* (optional) why the calling thread's last call did not return LOOM_KERNEL_OK. */
  const char* (*last_error)(void);

  /* HF's RMSNorm over the last dimension of x [rows, dim]: h = x * rstd in fp32,
   * rstd = 1 / sqrt(mean(x^2) + eps); y = weight * h rounded to dtype first (as HF does).
   * rstd (optional) [rows] receives the statistics for the backward. */
  int (*rms_norm_forward)(loom_dtype dtype, const void* x, const void* weight, void* y, float* rstd, int64_t rows,
                          int64_t dim, double eps, void* stream);
  /* dx [rows, dim] in dtype; dweight [dim] fp32, overwritten (not accumulated). rstd (optional):
   * the forward's, else recomputed. */
  int (*rms_norm_backward)(loom_dtype dtype, const void* x, const void* weight, const void* dy, const float* rstd,
                           void* dx, float* dweight, int64_t rows, int64_t dim, double eps, void* stream);

  /* HF's split-half rotary embedding, in place: x = x * cos + rotate_half(x) * sin for
   * q [batch, q_heads, seq, head_dim] and k [batch, k_heads, seq, head_dim] (either may be NULL
   * with 0 heads). cos and sin are [seq, head_dim] when cos_batch_stride is 0, else
   * [batch, seq, head_dim] with that stride between batches (position ids per sequence). */
  int (*rope_forward)(loom_dtype dtype, void* q, void* k, const void* cos, const void* sin, int64_t batch,
                      int64_t q_heads, int64_t k_heads, int64_t seq, int64_t head_dim, int64_t cos_batch_stride,
                      void* stream);
  /* The transpose, in place on the gradients dq and dk: the backward of rope_forward. */
  int (*rope_backward)(loom_dtype dtype, void* dq, void* dk, const void* cos, const void* sin, int64_t batch,
                       int64_t q_heads, int64_t k_heads, int64_t seq, int64_t head_dim, int64_t cos_batch_stride,
                       void* stream);

  /* out = silu(gate) * up over n elements. */
  int (*swiglu_forward)(loom_dtype dtype, const void* gate, const void* up, void* out, int64_t n, void* stream);
  int (*swiglu_backward)(loom_dtype dtype, const void* gate, const void* up, const void* dout, void* dgate, void* dup,
                         int64_t n, void* stream);

  /* Over the vocabulary: logits [rows, vocab] in dtype, labels [rows] int64. The fp32 values of
   * at most one row at a time exist (per thread); results are fp32 [rows].
   * cross_entropy_forward: loss = logsumexp(row) - row[label], 0 where label == ignore_index;
   * lse (optional) receives logsumexp for the backward. The host reduces (mean over rows whose
   * label is not ignored). A label outside [0, vocab) that is not ignore_index: INVALID_ARGUMENT.
   * On "cuda" the labels are device memory, checked by the kernels without a sync: such a row's
   * outputs are NaN, and the process's next call that takes labels (this one, the backward or
   * logprobs) returns INVALID_ARGUMENT naming label and row (kernels/cuda/plugin.cc). */
  int (*cross_entropy_forward)(loom_dtype dtype, const void* logits, const int64_t* labels, int64_t rows,
                               int64_t vocab, int64_t ignore_index, float* loss, float* lse, void* stream);
  /* dlogits = dloss[row] * (softmax(row) - onehot(label)); 0 rows where ignored. lse (optional):
   * the forward's, else recomputed. The backward of logprobs is this with dloss = -dlogprob. */
  int (*cross_entropy_backward)(loom_dtype dtype, const void* logits, const int64_t* labels, const float* lse,
                                const float* dloss, void* dlogits, int64_t rows, int64_t vocab, int64_t ignore_index,
                                void* stream);
  /* out = log_softmax(row)[label]. */
  int (*logprobs)(loom_dtype dtype, const void* logits, const int64_t* labels, int64_t rows, int64_t vocab,
                  float* out, void* stream);
  /* out = -sum(softmax(row) * log_softmax(row)). */
  int (*entropy)(loom_dtype dtype, const void* logits, int64_t rows, int64_t vocab, float* out, void* stream);
  /* out = KL(P || Q) = sum(P * (log P - log Q)), P = softmax(logits_p row), Q = softmax(logits_q row). */
  int (*kl_divergence)(loom_dtype dtype, const void* logits_p, const void* logits_q, int64_t rows, int64_t vocab,
                       float* out, void* stream);

  /* Optimizer steps over n parameters, in place. param and grad are fp32 or bf16 (bf16 params
   * are read into fp32, updated in fp32 and rounded back, as DeepSpeedCPUAdam does); the state
   * is fp32. */
  int (*adamw_step)(const loom_adam_config* config, loom_dtype param_dtype, void* param, loom_dtype grad_dtype,
                    const void* grad, float* exp_avg, float* exp_avg_sq, int64_t n, void* stream);
  int (*lion_step)(const loom_lion_config* config, loom_dtype param_dtype, void* param, loom_dtype grad_dtype,
                   const void* grad, float* exp_avg, int64_t n, void* stream);
  int (*adagrad_step)(const loom_adagrad_config* config, loom_dtype param_dtype, void* param, loom_dtype grad_dtype,
                      const void* grad, float* sum, int64_t n, void* stream);

  /* Appended in ABI 1 (a plugin built before has a smaller struct_size: "not provided"). */

  /* Softmax over the last dimension of x [rows, cols], of scale * x in fp32, over the entries
   * whose mask byte is not 0 (mask [rows, cols] uint8; NULL: every entry). Masked entries are 0,
   * and a row with no entry left is all 0, not NaN. y in dtype. */
  int (*masked_softmax_forward)(loom_dtype dtype, const void* x, const uint8_t* mask, void* y, int64_t rows,
                                int64_t cols, double scale, void* stream);
  /* dx = scale * y * (dy - sum(dy * y)) per row, from the forward's y (masked entries, y = 0,
   * get 0). */
  int (*masked_softmax_backward)(loom_dtype dtype, const void* y, const void* dy, void* dx, int64_t rows,
                                 int64_t cols, double scale, void* stream);

  /* GPT-OSS's clamped SwiGLU expert activation over n elements: g = min(gate, limit),
   * u = clamp(up, -limit, limit), out = (u + 1) * g * sigmoid(alpha * g) (GPT-OSS: alpha 1.702,
   * limit 7). Its backward follows torch.clamp: a gradient flows where gate <= limit and where
   * -limit <= up <= limit, none through a clamped value. */
  int (*clamped_swiglu_forward)(loom_dtype dtype, const void* gate, const void* up, void* out, int64_t n, double alpha,
                                double limit, void* stream);
  int (*clamped_swiglu_backward)(loom_dtype dtype, const void* gate, const void* up, const void* dout, void* dgate,
                                 void* dup, int64_t n, double alpha, double limit, void* stream);

  /* Rollout's decode attention over a paged KV cache: for each of `seqs` sequences, its one query
   * q [seqs, heads, dim] (at position context_lens[s] - 1) over the keys and values of its first
   * context_lens[s] positions, which sit in key_cache and value_cache [num_blocks, block_size,
   * kv_heads, dim] at the blocks block_tables [seqs, max_blocks] (int64) lists, position p in
   * block p / block_size at row p % block_size. Query head h reads KV head h / (heads / kv_heads).
   * softmax(scale * q.k) over those keys (window > 0: the last `window` of them) weights the
   * values; out [seqs, heads, dim]. All four tensors in dtype; context_lens (int64, device) >= 1. */
  int (*paged_attention_decode)(loom_dtype dtype, const void* q, const void* key_cache, const void* value_cache,
                                const int64_t* block_tables, const int64_t* context_lens, void* out, int64_t seqs,
                                int64_t heads, int64_t kv_heads, int64_t dim, int64_t block_size, int64_t max_blocks,
                                double scale, int64_t window, void* stream);

  /* Rollout's queries, keys and values of a step's `tokens` tokens on their way into attention,
   * in one pass: per token, q [heads, dim], k and v [kv_heads, dim], a head's dim elements
   * contiguous and token rows `q_stride` (q) and `kv_stride` (k, v) elements apart, so that
   * views of one fused projection [tokens, (heads + 2 kv_heads) dim] need no copy. q and k are
   * first normalized per head by HF's RMSNorm where q_norm and k_norm ([dim], both or neither:
   * Qwen3's) are given, then rotated by HF's split-half rotary embedding with cos and sin
   * [tokens, dim]. The rotated q goes to q_out [tokens, heads, dim]; the rotated k and the v go
   * to row slots[t] (int64, device memory on "cuda") of key_cache and value_cache
   * [rows, kv_heads, dim]. Roundings are those of the three ops it replaces. */
  int (*rope_kv_write)(loom_dtype dtype, const void* q, const void* k, const void* v, int64_t q_stride,
                       int64_t kv_stride, const void* q_norm, const void* k_norm, double eps, const void* cos,
                       const void* sin, const int64_t* slots, void* q_out, void* key_cache, void* value_cache,
                       int64_t tokens, int64_t heads, int64_t kv_heads, int64_t dim, void* stream);

  /* A residual add and the RMSNorm after it, in one pass over x, residual, sum and y [rows, dim]:
   * sum = x + residual rounded to dtype (a torch add), written to sum; y = rms_norm_forward's y of
   * that sum, with weight [dim]. The decoder's every add of a layer's output to the residual
   * stream is followed by such a norm. */
  int (*add_rms_norm)(loom_dtype dtype, const void* x, const void* residual, const void* weight, void* sum, void* y,
                      int64_t rows, int64_t dim, double eps, void* stream);

  /* Greedy decoding's pick and its logprob in one pass over logits [rows, vocab]: tokens[row] (int64)
   * the index of the row's largest value, the first of equal ones, a NaN counting as the largest
   * (torch.argmax); logprobs[row] (fp32) = log_softmax(row)[tokens[row]]. */
  int (*greedy_logprobs)(loom_dtype dtype, const void* logits, int64_t rows, int64_t vocab, int64_t* tokens,
                         float* logprobs, void* stream);
} loom_kernel_table;

/* The one symbol a plugin exports. */
typedef const loom_kernel_table* (*loom_kernel_plugin_fn)(void);

#if defined(_WIN32)
#define LOOM_KERNEL_EXPORT __declspec(dllexport)
#else
#define LOOM_KERNEL_EXPORT __attribute__((visibility("default")))
#endif

#ifdef __cplusplus
}
#endif

#endif /* LOOM_KERNEL_ABI_H */
