// The CUDA plugin's layer kernels: RMSNorm (HF's rounding; alone, or after a residual add), RoPE
// (HF split-half, in place), rollout's RoPE into the KV cache, and SwiGLU. The formulas and their
// roundings are the CPU plugin's (kernels/cpu/kernels_impl.h).
#include <cstdint>
#include <map>
#include <mutex>
#include <type_traits>

#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/device_common.cuh"

namespace loom::kernels::gpu {
namespace {

constexpr int kRowThreadCap = 512;
// add_rms_norm's threads per row at most: its sums live in registers (up to kAddRmsNormMaxChunks
// chunks a thread), and 256 threads leave each the 255 registers that takes.
constexpr int kAddRmsNormThreads = 256;
constexpr int kAddRmsNormMaxChunks = 16;
// Blocks of rms_norm_backward, each summing dweight over its rows: a fixed number (not one per
// multiprocessor) so that dweight's summation order, and so its bits, are the same on any GPU.
constexpr int64_t kRmsBackwardBlocks = 512;

__device__ __forceinline__ float rstdOf(float sumSquares, int64_t dim, float eps) {
  return 1.0f / sqrtf(sumSquares / static_cast<float>(dim) + eps);
}

template <typename T>
__device__ __forceinline__ float rowSumSquares(const T* __restrict__ x, int64_t dim) {
  constexpr int V = kVec<T>;
  float ss = 0.0f;
  forEachChunk(x, dim, [&](int64_t i, int count) {
    float v[V];
    loadChunk(x + i, count, v);
#pragma unroll
    for (int k = 0; k < V; ++k) ss = fmaf(v[k], v[k], ss);
  });
  return blockSum(ss);
}

// One block per row.
template <typename T>
__global__ void __launch_bounds__(kRowThreadCap)
    rmsNormForwardKernel(const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ y,
                         float* __restrict__ rstdOut, int64_t dim, float eps) {
  constexpr int V = kVec<T>;
  const int64_t row = blockIdx.x;
  const T* xr = x + row * dim;
  T* yr = y + row * dim;
  const float r = rstdOf(rowSumSquares(xr, dim), dim, eps);
  if (rstdOut && threadIdx.x == 0) rstdOut[row] = r;
  forEachChunk(xr, dim, [&](int64_t i, int count) {
    float xv[V], wv[V], out[V];
    loadChunk(xr + i, count, xv);
    loadChunk(w + i, count, wv);
#pragma unroll
    for (int k = 0; k < V; ++k) out[k] = __fmul_rn(wv[k], roundTo<T>(__fmul_rn(xv[k], r)));  // weight * h.to(dtype)
    storeChunk(yr + i, count, out);
  });
}

// One block per row, the row's sum held in registers between the two passes: thread t has the
// chunks j * blockDim.x + t (j < kChunks) of kVec<T> elements, so that a warp's accesses are
// contiguous. The norm's arithmetic and roundings are rmsNormForwardKernel's, on the sum rounded
// to T as a torch add rounds it. Where a thread holds few chunks it reads its weights before the
// block's reduction, so that their loads do not wait behind it.
template <typename T, int kChunks>
__global__ void __launch_bounds__(kAddRmsNormThreads)
    addRmsNormKernel(const T* __restrict__ x, const T* __restrict__ residual, const T* __restrict__ w,
                     T* __restrict__ sum, T* __restrict__ y, int64_t dim, float eps) {
  constexpr int V = kVec<T>;
  constexpr bool kWeightsEarly = kChunks <= 4;
  const int64_t base = static_cast<int64_t>(blockIdx.x) * dim;
  auto chunkAt = [&](int j) { return (static_cast<int64_t>(j) * blockDim.x + threadIdx.x) * V; };
  auto countAt = [&](int64_t i) { return i < dim ? static_cast<int>(dim - i < V ? dim - i : V) : 0; };
  float s[kChunks][V];
  float wv[kWeightsEarly ? kChunks : 1][V];
  float ss = 0.0f;
#pragma unroll
  for (int j = 0; j < kChunks; ++j) {
    const int64_t i = chunkAt(j);
    const int count = countAt(i);
    float a[V] = {}, b[V] = {};
    if (count > 0) {
      loadChunk(x + base + i, count, a);
      loadChunk(residual + base + i, count, b);
      if constexpr (kWeightsEarly) loadChunk(w + i, count, wv[j]);
    }
#pragma unroll
    for (int k = 0; k < V; ++k) {
      s[j][k] = roundTo<T>(__fadd_rn(a[k], b[k]));
      ss = fmaf(s[j][k], s[j][k], ss);
    }
    if (count > 0) storeChunk(sum + base + i, count, s[j]);
  }
  const float r = rstdOf(blockSum(ss), dim, eps);
#pragma unroll
  for (int j = 0; j < kChunks; ++j) {
    const int64_t i = chunkAt(j);
    const int count = countAt(i);
    if (count == 0) continue;
    float out[V];
    float* weights = wv[kWeightsEarly ? j : 0];
    if constexpr (!kWeightsEarly) loadChunk(w + i, count, wv[0]);
#pragma unroll
    for (int k = 0; k < V; ++k) out[k] = __fmul_rn(weights[k], roundTo<T>(__fmul_rn(s[j][k], r)));
    storeChunk(y + base + i, count, out);
  }
}

// Block b takes rows [rows * b / blocks, rows * (b + 1) / blocks) (at least one, as blocks <=
// rows): dx row by row, and its rows' sum of dy * h into a shared-memory partial of dweight that
// it writes to partials[b] at the end. dx = r (g - h mean(g h)) with g = dy w, h = x r.
template <typename T>
__global__ void __launch_bounds__(kRowThreadCap)
    rmsNormBackwardKernel(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ dy,
                          const float* __restrict__ rstdIn, T* __restrict__ dx, float* __restrict__ partials,
                          int64_t rows, int64_t dim, float eps) {
  constexpr int V = kVec<T>;
  extern __shared__ float dwAcc[];  // [dim]
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) dwAcc[i] = 0.0f;
  // The barriers inside blockSum below order the zeroing before any thread accumulates, and one
  // row's accumulation before the next row's (a chunk's thread changes with the row's alignment).
  const int64_t begin = rows * blockIdx.x / gridDim.x, end = rows * (blockIdx.x + 1) / gridDim.x;
  for (int64_t row = begin; row < end; ++row) {
    const T* xr = x + row * dim;
    const T* dyr = dy + row * dim;
    T* dxr = dx + row * dim;
    const float r = rstdIn ? rstdIn[row] : rstdOf(rowSumSquares(xr, dim), dim, eps);
    float acc = 0.0f;
    forEachChunk(xr, dim, [&](int64_t i, int count) {
      float xv[V], dyv[V], wv[V];
      loadChunk(xr + i, count, xv);
      loadChunk(dyr + i, count, dyv);
      loadChunk(w + i, count, wv);
#pragma unroll
      for (int k = 0; k < V; ++k) acc = fmaf(__fmul_rn(dyv[k], wv[k]), xv[k], acc);
    });
    const float meanGh = r * blockSum(acc) / static_cast<float>(dim);
    forEachChunk(xr, dim, [&](int64_t i, int count) {
      float xv[V], dyv[V], wv[V], out[V];
      loadChunk(xr + i, count, xv);
      loadChunk(dyr + i, count, dyv);
      loadChunk(w + i, count, wv);
#pragma unroll
      for (int k = 0; k < V; ++k) {
        const float h = __fmul_rn(xv[k], r), g = __fmul_rn(dyv[k], wv[k]);
        out[k] = __fmul_rn(r, __fsub_rn(g, __fmul_rn(h, meanGh)));
        if (k < count) dwAcc[i + k] = fmaf(dyv[k], roundTo<T>(h), dwAcc[i + k]);  // h rounded as the forward did
      }
      storeChunk(dxr + i, count, out);
    });
  }
  __syncthreads();
  float* part = partials + static_cast<int64_t>(blockIdx.x) * dim;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) part[i] = dwAcc[i];
}

// dweight[i] = the sum of partials[b][i] over b. A block takes 32 columns (threadIdx.x, reads
// coalesced along a partial) and 32 lanes of partials (threadIdx.y sums b = y, y + 32, ...); the
// 32 lane sums then add in a fixed tree. Fixed order, so deterministic, and 32 times the threads
// of one sum per column, whose serial loads would leave the kernel waiting on memory.
constexpr int kPartialLanes = 32;
__global__ void __launch_bounds__(32 * kPartialLanes)
    sumPartialsKernel(const float* __restrict__ partials, int blocks, int64_t dim, float* __restrict__ out) {
  __shared__ float lanes[kPartialLanes][33];  // padded: the tree reads down a column
  const int64_t i = static_cast<int64_t>(blockIdx.x) * 32 + threadIdx.x;
  float s = 0.0f;
  if (i < dim) {
#pragma unroll 4
    for (int b = threadIdx.y; b < blocks; b += kPartialLanes) s += partials[b * dim + i];
  }
  lanes[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  for (int half = kPartialLanes / 2; half > 0; half /= 2) {
    if (threadIdx.y < half) lanes[threadIdx.y][threadIdx.x] += lanes[threadIdx.y + half][threadIdx.x];
    __syncthreads();
  }
  if (threadIdx.y == 0 && i < dim) out[i] = lanes[0][threadIdx.x];
}

// Rows of head_dim elements, `threadsPerRow` threads each (a power of two up to 128); a thread
// rotates the pairs (i, i + half) for the chunk of kVec<T> i's at lane * kVec<T>, then every
// threadsPerRow chunks on: 16-byte loads and stores where the row allows.
template <typename T>
__global__ void ropeKernel(RopeArgs a, int threadsPerRow) {
  constexpr int V = kVec<T>;
  const int rowsPerBlock = blockDim.x / threadsPerRow;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * rowsPerBlock + threadIdx.x / threadsPerRow;
  if (row >= a.qRows + a.kRows) return;
  const int64_t d = a.headDim, half = d / 2;
  T* x;
  int64_t b, s;
  if (row < a.qRows) {
    x = static_cast<T*>(a.q) + row * d;
    b = row / (a.qHeads * a.seq);
    s = row % a.seq;
  } else {
    const int64_t kr = row - a.qRows;
    x = static_cast<T*>(a.k) + kr * d;
    b = kr / (a.kHeads * a.seq);
    s = kr % a.seq;
  }
  const T* c = static_cast<const T*>(a.cos) + b * a.cosBatchStride + s * d;
  const T* sn = static_cast<const T*>(a.sin) + b * a.cosBatchStride + s * d;
  // Each product rounded to T, then the sum, as the reference's tensor ops round them.
  auto mul = [](float u, float v) { return roundTo<T>(__fmul_rn(u, v)); };
  for (int64_t i = static_cast<int64_t>(threadIdx.x % threadsPerRow) * V; i < half;
       i += static_cast<int64_t>(threadsPerRow) * V) {
    const int count = half - i < V ? static_cast<int>(half - i) : V;
    float x1[V], x2[V], c1[V], c2[V], s1[V], s2[V], o1[V], o2[V];
    loadChunk(x + i, count, x1);
    loadChunk(x + half + i, count, x2);
    loadChunk(c + i, count, c1);
    loadChunk(c + half + i, count, c2);
    loadChunk(sn + i, count, s1);
    loadChunk(sn + half + i, count, s2);
#pragma unroll
    for (int k = 0; k < V; ++k) {
      if (!a.backward) {  // x * cos + rotate_half(x) * sin, rotate_half(x) = [-x2, x1]
        o1[k] = __fadd_rn(mul(x1[k], c1[k]), mul(-x2[k], s1[k]));
        o2[k] = __fadd_rn(mul(x2[k], c2[k]), mul(x1[k], s2[k]));
      } else {  // the transpose: dx1 = dy1 cos1 + dy2 sin2, dx2 = dy2 cos2 - dy1 sin1
        o1[k] = __fadd_rn(mul(x1[k], c1[k]), mul(x2[k], s2[k]));
        o2[k] = __fsub_rn(mul(x2[k], c2[k]), mul(x1[k], s1[k]));
      }
    }
    storeChunk(x + i, count, o1);
    storeChunk(x + half + i, count, o2);
  }
}

// rope_kv_write: a group of threadsPerRow lanes (a power of two up to 32) per row of head_dim
// elements, the step's q rows first, then its k rows, then its v rows. A lane takes the pairs
// (i, i + half) of its chunks, as ropeKernel does; a v row is copied as it is. With norms, a q or k
// row's lanes sum its squares by shuffles within the group first, and each element is normalized
// (and rounded as rmsNormForwardKernel rounds it) before it is rotated.
template <typename T>
__global__ void ropeKvWriteKernel(RopeKvWriteArgs a, int threadsPerRow) {
  constexpr int V = kVec<T>;
  const int rowsPerBlock = blockDim.x / threadsPerRow;
  const int lane = threadIdx.x % threadsPerRow;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * rowsPerBlock + threadIdx.x / threadsPerRow;
  const int64_t qRows = a.tokens * a.heads, kvRows = a.tokens * a.kvHeads;
  // A group leaves whole, so the shuffles below name only the lanes of their own group.
  if (row >= qRows + 2 * kvRows) return;
  const int64_t d = a.dim, half = d / 2;
  const T* src;
  T* dst;
  const T* norm = nullptr;
  int64_t token;
  if (row < qRows) {
    token = row / a.heads;
    src = static_cast<const T*>(a.q) + token * a.qStride + row % a.heads * d;
    dst = static_cast<T*>(a.qOut) + row * d;
    norm = static_cast<const T*>(a.qNorm);
  } else {
    const bool isKey = row < qRows + kvRows;
    const int64_t r = row - qRows - (isKey ? 0 : kvRows), head = r % a.kvHeads;
    token = r / a.kvHeads;
    src = static_cast<const T*>(isKey ? a.k : a.v) + token * a.kvStride + head * d;
    dst = static_cast<T*>(isKey ? a.keyCache : a.valueCache) + (a.slots[token] * a.kvHeads + head) * d;
    if (!isKey) {
      for (int64_t i = static_cast<int64_t>(lane) * V; i < d; i += static_cast<int64_t>(threadsPerRow) * V) {
        const int count = d - i < V ? static_cast<int>(d - i) : V;
        float x[V];
        loadChunk(src + i, count, x);
        storeChunk(dst + i, count, x);
      }
      return;
    }
    norm = static_cast<const T*>(a.kNorm);
  }
  const int64_t step = static_cast<int64_t>(threadsPerRow) * V;
  float rstd = 0.0f;
  if (norm) {
    float ss = 0.0f;
    for (int64_t i = static_cast<int64_t>(lane) * V; i < half; i += step) {
      const int count = half - i < V ? static_cast<int>(half - i) : V;
      float x1[V], x2[V];
      loadChunk(src + i, count, x1);
      loadChunk(src + half + i, count, x2);
#pragma unroll
      for (int k = 0; k < V; ++k) ss = fmaf(x2[k], x2[k], fmaf(x1[k], x1[k], ss));
    }
    const unsigned group = threadsPerRow == 32 ? 0xffffffffu
                                               : ((1u << threadsPerRow) - 1) << (threadIdx.x % 32 / threadsPerRow * threadsPerRow);
    for (int offset = threadsPerRow / 2; offset > 0; offset /= 2) ss += __shfl_xor_sync(group, ss, offset);
    rstd = rstdOf(ss, d, a.eps);
  }
  const T* c = static_cast<const T*>(a.cos) + token * d;
  const T* sn = static_cast<const T*>(a.sin) + token * d;
  auto mul = [](float u, float v) { return roundTo<T>(__fmul_rn(u, v)); };
  for (int64_t i = static_cast<int64_t>(lane) * V; i < half; i += step) {
    const int count = half - i < V ? static_cast<int>(half - i) : V;
    float x1[V], x2[V], c1[V], c2[V], s1[V], s2[V], o1[V], o2[V];
    loadChunk(src + i, count, x1);
    loadChunk(src + half + i, count, x2);
    if (norm) {  // weight * h.to(dtype), rounded to dtype: rmsNormForwardKernel's output
      float w1[V], w2[V];
      loadChunk(norm + i, count, w1);
      loadChunk(norm + half + i, count, w2);
#pragma unroll
      for (int k = 0; k < V; ++k) {
        x1[k] = mul(w1[k], roundTo<T>(__fmul_rn(x1[k], rstd)));
        x2[k] = mul(w2[k], roundTo<T>(__fmul_rn(x2[k], rstd)));
      }
    }
    loadChunk(c + i, count, c1);
    loadChunk(c + half + i, count, c2);
    loadChunk(sn + i, count, s1);
    loadChunk(sn + half + i, count, s2);
#pragma unroll
    for (int k = 0; k < V; ++k) {
      o1[k] = __fadd_rn(mul(x1[k], c1[k]), mul(-x2[k], s1[k]));
      o2[k] = __fadd_rn(mul(x2[k], c2[k]), mul(x1[k], s2[k]));
    }
    storeChunk(dst + i, count, o1);
    storeChunk(dst + half + i, count, o2);
  }
}

constexpr int kElementThreads = 256;

template <typename T>
__global__ void swigluForwardKernel(const T* __restrict__ gate, const T* __restrict__ up, T* __restrict__ out,
                                    int64_t n) {
  constexpr int V = kVec<T>;
  const int64_t i = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * V;
  if (i >= n) return;
  const int count = n - i < V ? static_cast<int>(n - i) : V;
  float g[V], u[V], o[V];
  loadChunk(gate + i, count, g);
  loadChunk(up + i, count, u);
#pragma unroll
  for (int k = 0; k < V; ++k) {
    const float silu = roundTo<T>(g[k] / (1.0f + expf(-g[k])));  // torch's silu
    o[k] = __fmul_rn(silu, u[k]);
  }
  storeChunk(out + i, count, o);
}

template <typename T>
__global__ void swigluBackwardKernel(const T* __restrict__ gate, const T* __restrict__ up, const T* __restrict__ dout,
                                     T* __restrict__ dgate, T* __restrict__ dup, int64_t n) {
  constexpr int V = kVec<T>;
  const int64_t i = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * V;
  if (i >= n) return;
  const int count = n - i < V ? static_cast<int>(n - i) : V;
  float g[V], u[V], dy[V], dg[V], du[V];
  loadChunk(gate + i, count, g);
  loadChunk(up + i, count, u);
  loadChunk(dout + i, count, dy);
#pragma unroll
  for (int k = 0; k < V; ++k) {
    const float e = expf(-g[k]);
    const float sig = 1.0f / (1.0f + e);
    // torch's silu_backward on ds = dout * up (rounded to T, as autograd's product is):
    // ds * sig * (1 + g (1 - sig)).
    const float ds = roundTo<T>(__fmul_rn(dy[k], u[k]));
    dg[k] = __fmul_rn(__fmul_rn(ds, sig), __fadd_rn(1.0f, __fmul_rn(g[k], __fsub_rn(1.0f, sig))));
    du[k] = __fmul_rn(dy[k], roundTo<T>(g[k] / (1.0f + e)));  // dout * silu(gate) as the forward rounded it
  }
  storeChunk(dgate + i, count, dg);
  storeChunk(dup + i, count, du);
}

template <typename T>
unsigned elementBlocks(int64_t n) {
  const int64_t chunks = (n + kVec<T> - 1) / kVec<T>;
  return static_cast<unsigned>((chunks + kElementThreads - 1) / kElementThreads);
}

// rms_norm_backward's partials come from a stream-ordered pool of the plugin's own per device,
// which keeps what it has allocated (release threshold: unlimited; the most it holds is the
// largest call's partials, 512 * dim * 4 bytes). The device's default pool returns its memory at
// every synchronization and would map it again at the next call.
cudaError_t partialsPool(cudaMemPool_t* pool) {
  int device = 0;
  if (cudaError_t err = cudaGetDevice(&device); err != cudaSuccess) return err;
  static std::mutex mutex;
  static std::map<int, cudaMemPool_t> pools;
  std::lock_guard<std::mutex> lock(mutex);
  if (auto it = pools.find(device); it != pools.end()) {
    *pool = it->second;
    return cudaSuccess;
  }
  cudaMemPoolProps props{};
  props.allocType = cudaMemAllocationTypePinned;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id = device;
  if (cudaError_t err = cudaMemPoolCreate(pool, &props); err != cudaSuccess) return err;
  uint64_t keepAll = UINT64_MAX;
  if (cudaError_t err = cudaMemPoolSetAttribute(*pool, cudaMemPoolAttrReleaseThreshold, &keepAll);
      err != cudaSuccess)
    return err;
  pools.emplace(device, *pool);
  return cudaSuccess;
}

// Lanes for a row of `chunks` chunks: the power of two that covers them, at most `cap`.
int lanesPerRow(int64_t chunks, int cap) {
  int lanes = 1;
  while (lanes < chunks && lanes < cap) lanes *= 2;
  return lanes;
}

}  // namespace

cudaError_t launchRmsNormForward(const RmsNormArgs& a, cudaStream_t stream) {
  byDtype(a.dtype, [&](auto tag) {
    using T = decltype(tag);
    const int threads = rowThreads((a.dim + 2 * kVec<T> - 1) / (2 * kVec<T>), kRowThreadCap);
    rmsNormForwardKernel<T><<<static_cast<unsigned>(a.rows), threads, 0, stream>>>(
        static_cast<const T*>(a.x), static_cast<const T*>(a.weight), static_cast<T*>(a.y), a.rstdOut, a.dim, a.eps);
  });
  return cudaGetLastError();
}

int64_t addRmsNormMaxDim(loom_dtype dtype) {
  return int64_t{kAddRmsNormThreads} * kAddRmsNormMaxChunks * (dtype == LOOM_DTYPE_BF16 ? kVec<Bf16> : kVec<float>);
}

cudaError_t launchAddRmsNorm(const AddRmsNormArgs& a, cudaStream_t stream) {
  byDtype(a.dtype, [&](auto tag) {
    using T = decltype(tag);
    const int64_t chunks = (a.dim + kVec<T> - 1) / kVec<T>;
    auto launch = [&](auto chunksPerThread) {
      constexpr int kChunks = decltype(chunksPerThread)::value;
      const int threads = rowThreads((chunks + kChunks - 1) / kChunks, kAddRmsNormThreads);
      addRmsNormKernel<T, kChunks><<<static_cast<unsigned>(a.rows), threads, 0, stream>>>(
          static_cast<const T*>(a.x), static_cast<const T*>(a.residual), static_cast<const T*>(a.weight),
          static_cast<T*>(a.sum), static_cast<T*>(a.y), a.dim, a.eps);
    };
    // The fewest chunks a thread that cover the row with at most kAddRmsNormThreads threads.
    const int64_t perThread = (chunks + kAddRmsNormThreads - 1) / kAddRmsNormThreads;
    if (perThread <= 1) {
      launch(std::integral_constant<int, 1>{});
    } else if (perThread <= 2) {
      launch(std::integral_constant<int, 2>{});
    } else if (perThread <= 4) {
      launch(std::integral_constant<int, 4>{});
    } else if (perThread <= 8) {
      launch(std::integral_constant<int, 8>{});
    } else {
      static_assert(kAddRmsNormMaxChunks == 16);
      launch(std::integral_constant<int, 16>{});
    }
  });
  return cudaGetLastError();
}

int64_t rmsNormBackwardMaxDim() {
  int device = 0, bytes = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  // Less the block reduction's static shared memory (32 floats, rounded up generously).
  return (static_cast<int64_t>(bytes) - 1024) / static_cast<int64_t>(sizeof(float));
}

cudaError_t launchRmsNormBackward(const RmsNormArgs& a, cudaStream_t stream) {
  const int blocks = static_cast<int>(a.rows < kRmsBackwardBlocks ? a.rows : kRmsBackwardBlocks);
  const size_t smem = static_cast<size_t>(a.dim) * sizeof(float);
  // The partials live only for this call; the stream-ordered allocator makes that free of syncs.
  cudaMemPool_t pool;
  if (cudaError_t err = partialsPool(&pool); err != cudaSuccess) return err;
  float* partials = nullptr;
  if (cudaError_t err = cudaMallocFromPoolAsync(reinterpret_cast<void**>(&partials),
                                                static_cast<size_t>(blocks) * smem, pool, stream);
      err != cudaSuccess)
    return err;
  byDtype(a.dtype, [&](auto tag) {
    using T = decltype(tag);
    auto kernel = rmsNormBackwardKernel<T>;
    if (smem > 48 * 1024)  // past the default limit: opt in, per device, before the launch
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
    const int threads = rowThreads((a.dim + 2 * kVec<T> - 1) / (2 * kVec<T>), kRowThreadCap);
    kernel<<<blocks, threads, smem, stream>>>(static_cast<const T*>(a.x), static_cast<const T*>(a.weight),
                                              static_cast<const T*>(a.dy), a.rstdIn, static_cast<T*>(a.dx), partials,
                                              a.rows, a.dim, a.eps);
  });
  sumPartialsKernel<<<static_cast<unsigned>((a.dim + 31) / 32), dim3(32, kPartialLanes), 0, stream>>>(
      partials, blocks, a.dim, a.dweight);
  cudaFreeAsync(partials, stream);
  return cudaGetLastError();
}

cudaError_t launchRope(const RopeArgs& a, cudaStream_t stream) {
  const int64_t half = a.headDim / 2;
  byDtype(a.dtype, [&](auto tag) {
    using T = decltype(tag);
    const int threadsPerRow = lanesPerRow((half + kVec<T> - 1) / kVec<T>, 128);
    const int threads = 256, rowsPerBlock = threads / threadsPerRow;
    const int64_t rows = a.qRows + a.kRows;
    const auto blocks = static_cast<unsigned>((rows + rowsPerBlock - 1) / rowsPerBlock);
    ropeKernel<T><<<blocks, threads, 0, stream>>>(a, threadsPerRow);
  });
  return cudaGetLastError();
}

cudaError_t launchRopeKvWrite(const RopeKvWriteArgs& a, cudaStream_t stream) {
  byDtype(a.dtype, [&](auto tag) {
    using T = decltype(tag);
    // At most a warp per row: a row's lanes sum its squares by shuffles.
    const int threadsPerRow = lanesPerRow((a.dim / 2 + kVec<T> - 1) / kVec<T>, 32);
    const int threads = 256, rowsPerBlock = threads / threadsPerRow;
    const int64_t rows = a.tokens * (a.heads + 2 * a.kvHeads);
    const auto blocks = static_cast<unsigned>((rows + rowsPerBlock - 1) / rowsPerBlock);
    ropeKvWriteKernel<T><<<blocks, threads, 0, stream>>>(a, threadsPerRow);
  });
  return cudaGetLastError();
}

cudaError_t launchSwigluForward(const SwigluArgs& a, cudaStream_t stream) {
  byDtype(a.dtype, [&](auto tag) {
    using T = decltype(tag);
    swigluForwardKernel<T><<<elementBlocks<T>(a.n), kElementThreads, 0, stream>>>(
        static_cast<const T*>(a.gate), static_cast<const T*>(a.up), static_cast<T*>(a.out), a.n);
  });
  return cudaGetLastError();
}

cudaError_t launchSwigluBackward(const SwigluArgs& a, cudaStream_t stream) {
  byDtype(a.dtype, [&](auto tag) {
    using T = decltype(tag);
    swigluBackwardKernel<T><<<elementBlocks<T>(a.n), kElementThreads, 0, stream>>>(
        static_cast<const T*>(a.gate), static_cast<const T*>(a.up), static_cast<const T*>(a.dout),
        static_cast<T*>(a.dgate), static_cast<T*>(a.dup), a.n);
  });
  return cudaGetLastError();
}

}  // namespace loom::kernels::gpu
