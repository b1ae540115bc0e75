#include "worker/torch/jobs/collective_probe.h"

#include <algorithm>
#include <chrono>
#include <cstdio>

#include <ATen/ATen.h>
#include <fmt/format.h>

#include "backends/comms_logger.h"
#include "worker/torch/model/model_setup.h"
#include "worker/torch/parallel/world.h"

namespace loom::worker {

namespace {

using backends::Communicator;
using backends::ReduceOp;

at::ScalarType dtypeOf(const std::string& name) {
  if (name == "bfloat16") return at::kBFloat16;
  if (name == "float16") return at::kHalf;
  if (name == "int64") return at::kLong;
  return at::kFloat;
}

// The tensors of one op at one size, filled so that the result is known exactly in every dtype
// and for any number of ranks: reductions add values of 1 or 2 (every partial sum of up to 128
// ranks is an integer bfloat16 holds exactly); data movement carries (i + rank) % 7 + 1, so a
// misplaced part shows.
struct Case {
  at::Tensor input, output, expected;
  std::vector<int64_t> inSplits, outSplits;  // all_to_all_v
};

// all_to_all_v's uneven parts, as an MoE's dispatch sends them: rank i sends rank j
// ((i + j) % n + 1) units, so every rank sends and receives n (n + 1) / 2 units in all, the
// largest part n times the smallest.
int64_t unevenPart(int from, int to, int n, int64_t unit) { return unit * ((from + to) % n + 1); }
int64_t unevenUnits(int n) { return int64_t{n} * (n + 1) / 2; }

at::Tensor ones(int64_t n, int64_t offset, double scale, at::ScalarType dtype) {
  return ((at::arange(offset, offset + n, at::kLong) % 2 + 1).to(at::kDouble) * scale).to(dtype);
}

at::Tensor marked(int64_t n, int rank, at::ScalarType dtype) {
  return ((at::arange(n, at::kLong) + rank) % 7 + 1).to(dtype);
}

Case makeCase(const std::string& op, int64_t count, int rank, int n, at::ScalarType dtype) {
  if (op == "all_reduce") return {ones(count, 0, 1, dtype), {}, ones(count, 0, n, dtype)};
  if (op == "all_gather") {
    std::vector<at::Tensor> parts;
    for (int j = 0; j < n; ++j) parts.push_back(marked(count / n, j, dtype));
    return {marked(count / n, rank, dtype), at::empty({count}, dtype), at::cat(parts)};
  }
  if (op == "reduce_scatter") {
    const int64_t part = count / n;
    return {ones(count, 0, 1, dtype), at::empty({part}, dtype), ones(part, rank * part, n, dtype)};
  }
  if (op == "all_to_all_v") {
    const int64_t unit = count / unevenUnits(n);
    Case k{{}, at::empty({count}, dtype), {}, {}, {}};
    std::vector<at::Tensor> sent, expected;
    for (int j = 0; j < n; ++j) {
      k.inSplits.push_back(unevenPart(rank, j, n, unit));
      k.outSplits.push_back(unevenPart(j, rank, n, unit));
      sent.push_back(marked(k.inSplits.back(), rank, dtype));
      expected.push_back(marked(k.outSplits.back(), j, dtype));
    }
    k.input = at::cat(sent);
    k.expected = at::cat(expected);
    return k;
  }
  if (op == "all_to_all") {
    // Every part of rank i's input is marked(part, i): rank r's output part i equals it.
    const int64_t part = count / n;
    std::vector<at::Tensor> expected;
    for (int i = 0; i < n; ++i) expected.push_back(marked(part, i, dtype));
    return {marked(part, rank, dtype).repeat({n}), at::empty({count}, dtype), at::cat(expected)};
  }
  // broadcast from rank 0
  return {rank == 0 ? marked(count, 0, dtype) : at::zeros({count}, dtype), {}, marked(count, 0, dtype)};
}

std::shared_ptr<backends::Work> issue(Communicator& c, const std::string& op, Case& k) {
  if (op == "all_reduce") return c.allReduce(k.input, ReduceOp::kSum);
  if (op == "all_gather") return c.allGather(k.output, k.input);
  if (op == "reduce_scatter") return c.reduceScatter(k.output, k.input, ReduceOp::kSum);
  if (op == "all_to_all") return c.allToAll(k.output, k.input);
  if (op == "all_to_all_v") return c.allToAllV(k.output, k.input, k.outSplits, k.inSplits);
  return c.broadcast(k.input, 0);
}

// The tensors the op reads and writes go where `sharedMemory` says (the communicator's
// allocate(), or ordinary memory on `device`); the expected result is only compared.
Case place(Case k, Communicator& c, const at::Device& device, bool sharedMemory) {
  for (at::Tensor* t : {&k.input, &k.output}) {
    if (!t->defined()) continue;
    *t = sharedMemory ? c.allocate(t->sizes(), t->scalar_type()).copy_(*t) : t->to(device);
  }
  k.expected = k.expected.to(device);
  return k;
}

// In-place ops leave their result in the input, and the next iteration must start from the
// pattern again.
bool inPlace(const std::string& op) { return op == "all_reduce" || op == "broadcast"; }

std::string humanBytes(int64_t b) {
  if (b >= (1 << 20)) return fmt::format("{} MiB", b >> 20);
  if (b >= (1 << 10)) return fmt::format("{} KiB", b >> 10);
  return fmt::format("{} B", b);
}

}  // namespace

Status runCollectiveProbe(const RankContext& ctx, const planner::JobSpec& spec, const TorchRuntime::ProgressFn& progress) {
  const auto& cfg = *spec.probe.collectives;
  // resources.device cuda: NCCL on each rank's GPU, like nccl-tests; else UCX on host memory.
  const bool cuda = spec.device == planner::DeviceKind::kCuda;
  const at::Device device = rankDevice(spec, ctx.localRank);
  makeCurrent(device);
  ASSIGN_OR_RETURN(World connected, connectWorld(ctx, spec, cuda ? TensorHome::kCuda : TensorHome::kHost));
  backends::Communicator* world = connected.comm.get();
  backends::CommsLogger& logger = *connected.logger;
  const int n = world->size();
  const at::ScalarType dtype = dtypeOf(cfg.dtype);
  const int64_t elem = static_cast<int64_t>(c10::elementSize(dtype));

  if (ctx.rank == 0) {
    std::printf("# collective benchmark: %d ranks, %s, %s, %s, median of %d repeats of %d iterations after %d "
                "warm-up\n",
                n, cfg.dtype.c_str(), cuda ? "NCCL on the GPUs" : "UCX on host memory",
                cfg.sharedMemory ? "tensors from the communicator's allocate()" : "ordinary tensors", cfg.repeats,
                cfg.iterations, cfg.warmup);
    std::printf("%-16s %12s %12s %12s %12s %12s %8s\n", "op", "size", "count", "time (us)", "algbw GB/s",
                "busbw GB/s", "#wrong");
  }
  int64_t step = 0;
  for (const auto& op : cfg.ops) {
    for (int64_t bytes = cfg.minBytes; bytes <= cfg.maxBytes; bytes *= 2) {
      // Whole elements, divisible into n parts for the ops that split.
      int64_t count = std::max<int64_t>(1, bytes / elem);
      if (op != "all_reduce" && op != "broadcast") count = std::max<int64_t>(n, count / n * n);
      if (op == "all_to_all_v") count = std::max<int64_t>(unevenUnits(n), count / unevenUnits(n) * unevenUnits(n));
      const int64_t size = count * elem;
      Case k = place(makeCase(op, count, ctx.rank, n, dtype), *world, device, cfg.sharedMemory);
      const at::Tensor pristine = inPlace(op) ? k.input.clone() : at::Tensor();

      // Large sizes get fewer iterations: at most ~2 GiB moved per size.
      const int iterations =
          static_cast<int>(std::max<int64_t>(1, std::min<int64_t>((int64_t(2) << 30) / size, cfg.iterations)));
      for (int i = 0; i < cfg.warmup; ++i) {
        if (inPlace(op)) k.input.copy_(pristine);
        RETURN_IF_ERROR(issue(*world, op, k)->wait());
      }
      if (inPlace(op)) k.input.copy_(pristine);
      RETURN_IF_ERROR(issue(*world, op, k)->wait());
      const at::Tensor& result = inPlace(op) ? k.input : k.output;
      const int64_t wrong = result.ne(k.expected).sum().item<int64_t>();

      // Each repeat times `iterations` ops from a common start; a rank's time is the median of
      // its repeats' means, so that one stall of a shared machine does not stand for the size.
      std::vector<double> means;
      for (int repeat = 0; repeat < cfg.repeats; ++repeat) {
        RETURN_IF_ERROR(world->barrier()->wait());
        synchronize(device);
        const auto start = std::chrono::steady_clock::now();
        if (cuda) {
          // Queued back to back on the communicator's stream, as nccl-tests does; the last one's
          // end is all of them.
          std::shared_ptr<backends::Work> last;
          for (int i = 0; i < iterations; ++i) last = issue(*world, op, k);
          RETURN_IF_ERROR(last->wait());
        } else {
          for (int i = 0; i < iterations; ++i) RETURN_IF_ERROR(issue(*world, op, k)->wait());
        }
        means.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / iterations);
      }
      std::sort(means.begin(), means.end());
      double seconds = means[means.size() / 2];
      // The slowest rank's time and every rank's wrong count.
      auto stats = at::tensor({seconds, static_cast<double>(wrong)}, at::kDouble).to(device);
      auto slowest = stats.slice(0, 0, 1).clone(), wrongs = stats.slice(0, 1, 2).clone();
      RETURN_IF_ERROR(world->allReduce(slowest, ReduceOp::kMax)->wait());
      RETURN_IF_ERROR(world->allReduce(wrongs, ReduceOp::kSum)->wait());
      seconds = slowest.item<double>();
      const double algbw = size / seconds / 1e9;
      const double busbw = algbw * backends::CommsLogger::busBandwidthFactor(op, n);
      const int64_t totalWrong = static_cast<int64_t>(wrongs.item<double>());
      if (ctx.rank == 0) {
        std::printf("%-16s %12s %12lld %12.1f %12.3f %12.3f %8lld\n", op.c_str(), humanBytes(size).c_str(),
                    static_cast<long long>(count), seconds * 1e6, algbw, busbw, static_cast<long long>(totalWrong));
        std::fflush(stdout);
      }
      progress(++step, {{"probe." + op + ".bytes", static_cast<double>(size)},
                        {"probe." + op + ".algbw_GBps", algbw},
                        {"probe." + op + ".busbw_GBps", busbw}});
      if (totalWrong > 0)
        return Status(StatusCode::kDataLoss, fmt::format("{} of {}: {} wrong elements over the ranks", op,
                                                         humanBytes(size), totalWrong));
    }
  }
  if (spec.deepspeed.commsLogger.enabled) {
    if (ctx.rank == 0) std::printf("# comms logger\n%s", logger.summary().c_str());
    progress(++step, logger.metrics());
  }
  return world->barrier()->wait();
}

}  // namespace loom::worker
