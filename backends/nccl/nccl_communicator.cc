#include "backends/nccl/nccl_communicator.h"

#include <algorithm>
#include <cstring>
#include <thread>

#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <fmt/format.h>

#include "backends/reduce.h"
#include "common/human_bytes.h"

namespace loom::backends {

namespace {

Status ncclStatus(const std::string& what, ncclResult_t r) {
  if (r == ncclSuccess) return Status::ok();
  return unavailable("{}: NCCL {}", what, ncclGetErrorString(r));
}

StatusOr<ncclDataType_t> ncclType(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return ncclFloat32;
    case at::kDouble: return ncclFloat64;
    case at::kHalf: return ncclFloat16;
    case at::kBFloat16: return ncclBfloat16;
    case at::kInt: return ncclInt32;
    case at::kLong: return ncclInt64;
    case at::kChar: return ncclInt8;
    case at::kByte: return ncclUint8;
    default: return invalidArgument("NCCL cannot carry {}", c10::toString(t));
  }
}

ncclRedOp_t ncclOp(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return ncclSum;
    case ReduceOp::kAvg: return ncclAvg;
    case ReduceOp::kMax: return ncclMax;
    case ReduceOp::kMin: return ncclMin;
  }
  return ncclSum;
}

// A tensor NCCL can take on this communicator's device; its NCCL type goes to `type` if given.
Status checkCuda(const at::Tensor& t, int device, const char* which, ncclDataType_t* type) {
  if (!t.defined()) return invalidArgument("{} tensor is undefined", which);
  if (!t.is_cuda() || t.get_device() != device)
    return invalidArgument("{} tensor is on {}: this communicator runs on cuda:{}", which, t.device().str(), device);
  if (!t.is_contiguous()) return invalidArgument("{} tensor is not contiguous", which);
  auto mapped = ncclType(t.scalar_type());
  if (!mapped.isOk()) return mapped.status();
  if (type) *type = *mapped;
  return Status::ok();
}

// A collective's Work. Its end is a CUDA event on the stream; the watchdog polls it every
// millisecond, but a caller blocked in wait() asks CUDA itself, so that the host learns of the end
// at once rather than up to a millisecond late while the GPU runs dry (a ZeRO-3 gather before its
// layer, a loss being read).
class NcclWork final : public Work {
 public:
  NcclWork(std::string description, std::shared_ptr<const std::atomic<bool>> failed)
      : Work(std::move(description)), failed_(std::move(failed)) {}
  ~NcclWork() override {
    if (end_) cudaEventDestroy(end_);
  }
  cudaEvent_t& end() { return end_; }

  Status wait(std::optional<std::chrono::milliseconds> timeout) override {
    using Clock = std::chrono::steady_clock;
    const auto start = Clock::now();
    const auto deadline = timeout ? start + *timeout : Clock::time_point::max();
    while (end_ && !isCompleted()) {
      const cudaError_t state = cudaEventQuery(end_);
      if (state == cudaSuccess) {
        // An aborted operation's kernels return too: the watchdog reports those.
        if (!failed_->load()) complete(Status::ok());
        break;
      }
      if (state != cudaErrorNotReady) break;  // the watchdog names the error
      const auto now = Clock::now();
      if (now >= deadline) break;
      // Spin through the first 200 us (most waits end there), then look every 50 us: a long
      // collective, or a peer that hangs until the watchdog's timeout, does not hold a core.
      if (now - start < std::chrono::microseconds(200)) {
        std::this_thread::yield();
      } else {
        std::this_thread::sleep_for(std::chrono::microseconds(50));
      }
    }
    if (!timeout) return Work::wait();
    if (!isCompleted() && Clock::now() >= deadline) return notCompleteAfter(*timeout);
    return Work::wait(std::chrono::ceil<std::chrono::milliseconds>(std::max(deadline - Clock::now(), Clock::duration(0))));
  }

 private:
  cudaEvent_t end_ = nullptr;
  std::shared_ptr<const std::atomic<bool>> failed_;
};

std::string describe(const at::Tensor& t) {
  return t.defined() ? fmt::format("{} {}", humanBytes(t.nbytes()), c10::toString(t.scalar_type())) : "undefined";
}

}  // namespace

Status NcclOptions::validate() const {
  if (worldSize < 1 || rank < 0 || rank >= worldSize) return invalidArgument("rank {} of world {}", rank, worldSize);
  if (!store && worldSize > 1) return invalidArgument("a store is needed to connect {} ranks", worldSize);
  if (device < 0) return invalidArgument("device {} is not a CUDA device index", device);
  return Status::ok();
}

StatusOr<std::shared_ptr<NcclCommunicator>> NcclCommunicator::create(const NcclOptions& options) {
  RETURN_IF_ERROR(options.validate());
  ncclUniqueId id;
  if (options.worldSize > 1) {
    // Every rank checks in first, so that a rank that never comes is named instead of leaving
    // the others inside ncclCommInitRank for good.
    RETURN_IF_ERROR(options.store->set(fmt::format("nccl/joined/{}", options.rank), "1"));
    std::vector<std::string> keys;
    for (int r = 0; r < options.worldSize; ++r) keys.push_back(fmt::format("nccl/joined/{}", r));
    auto joined = options.store->get(keys, options.rendezvousTimeout);
    if (!joined.isOk()) {
      std::string missing = joined.status().message();
      for (size_t p; (p = missing.find("nccl/joined/")) != std::string::npos;) missing.replace(p, 12, "rank ");
      return Status(joined.status().code(), "NCCL rendezvous: " + missing);
    }
  }
  if (options.rank == 0) {
    RETURN_IF_ERROR(ncclStatus("ncclGetUniqueId", ncclGetUniqueId(&id)));
    if (options.worldSize > 1)
      RETURN_IF_ERROR(options.store->set("nccl/world", std::string(reinterpret_cast<char*>(&id), sizeof id)));
  } else {
    auto value = options.store->get({"nccl/world"}, options.rendezvousTimeout);
    if (!value.isOk())
      return Status(value.status().code(), fmt::format("NCCL rendezvous: rank 0 did not publish the NCCL id within {} s",
                                                       options.rendezvousTimeout.count() / 1000.0));
    std::memcpy(&id, (*value)[0].data(), sizeof id);
  }
  c10::cuda::CUDAGuard guard(options.device);
  ncclComm_t comm;
  RETURN_IF_ERROR(ncclStatus(fmt::format("ncclCommInitRank (rank {} of {}, cuda:{})", options.rank, options.worldSize,
                                         options.device),
                             ncclCommInitRank(&comm, options.worldSize, id, options.rank)));
  return std::shared_ptr<NcclCommunicator>(
      new NcclCommunicator(comm, options.rank, options.worldSize, options.device, "world", options));
}

NcclCommunicator::NcclCommunicator(ncclComm_t comm, int rank, int size, int device, std::string name,
                                   NcclOptions options)
    : comm_(comm), rank_(rank), size_(size), device_(device), name_(std::move(name)), options_(options),
      stream_(c10::cuda::getStreamFromPool(/*isHighPriority=*/true, static_cast<c10::DeviceIndex>(device))) {
  c10::cuda::CUDAGuard guard(device_);
  cudaEventCreateWithFlags(&inputsReady_, cudaEventDisableTiming);
  watchdog_ = std::thread([this] { watch(); });
}

NcclCommunicator::~NcclCommunicator() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  watchdog_.join();
  if (broken_.isOk()) {
    ncclCommDestroy(comm_);
  }
  cudaEventDestroy(inputsReady_);
}

std::shared_ptr<Work> NcclCommunicator::run(const char* op, const std::string& detail, int64_t bytes,
                                            std::vector<at::Tensor> keep, Status valid,
                                            const std::function<ncclResult_t(cudaStream_t)>& launch) {
  std::lock_guard launching(launchMu_);
  const uint32_t seq = sequence_++;
  auto work =
      std::make_shared<NcclWork>(fmt::format("{} #{} on {} ({} ranks, NCCL), {}", op, seq, name_, size_, detail), failed_);
  {
    std::lock_guard lock(mu_);
    if (valid.isOk() && !broken_.isOk())
      valid = Status(broken_.code(), "not run, the communicator failed earlier: " + broken_.message());
  }
  if (!valid.isOk()) {
    work->complete(valid.withContext(work->description()));
    return work;
  }
  c10::cuda::CUDAGuard guard(device_);
  // The inputs are ready once the caller's stream gets here; the collective runs on stream_.
  cudaEventRecord(inputsReady_, c10::cuda::getCurrentCUDAStream(device_).stream());
  cudaStream_t stream = stream_.stream();
  cudaStreamWaitEvent(stream, inputsReady_, 0);
  const bool timed = options_.logger && options_.logger->wants(op);
  Pending p{work, op, bytes, nullptr, nullptr, std::chrono::steady_clock::now() + options_.operationTimeout,
            std::move(keep)};
  // Untimed events cost nothing to record; timed ones only when the comms logger profiles the op.
  cudaEventCreateWithFlags(&work->end(), timed ? cudaEventDefault : cudaEventDisableTiming);
  p.end = work->end();
  if (timed) {
    cudaEventCreate(&p.start);
    cudaEventRecord(p.start, stream);
  }
  Status launched = ncclStatus(work->description(), launch(stream));
  if (!launched.isOk()) {
    if (p.start) cudaEventDestroy(p.start);
    work->complete(launched);
    return work;
  }
  cudaEventRecord(p.end, stream);
  {
    std::lock_guard lock(mu_);
    pending_.push_back(std::move(p));
  }
  cv_.notify_all();
  return work;
}

// Polls the oldest pending operation's event every millisecond, without holding the lock while
// it asks CUDA, so that callers keep queueing work ahead of the GPU.
void NcclCommunicator::watch() {
  cudaSetDevice(device_);
  for (;;) {
    Pending* front = nullptr;
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || !pending_.empty(); });
      if (pending_.empty()) return;  // stopping, and nothing left
      front = &pending_.front();     // only this thread pops: stays valid unlocked
    }
    cudaError_t state = cudaEventQuery(front->end);
    if (state == cudaSuccess) {
      if (front->start) {
        float ms = 0;
        cudaEventElapsedTime(&ms, front->start, front->end);
        options_.logger->record(front->op, front->bytes, size_, ms / 1e3);
        cudaEventDestroy(front->start);
      }
      std::shared_ptr<Work> work;
      {
        std::lock_guard lock(mu_);
        work = std::move(front->work);
        pending_.pop_front();
      }
      work->complete(Status::ok());
      continue;
    }
    ncclResult_t async = ncclSuccess;
    ncclCommGetAsyncError(comm_, &async);
    const bool expired = std::chrono::steady_clock::now() > front->deadline;
    if (async == ncclSuccess && !expired && state == cudaErrorNotReady) {
      std::unique_lock lock(mu_);
      cv_.wait_for(lock, std::chrono::milliseconds(1), [&] { return stopping_; });
      continue;
    }
    // Abort so that every rank's kernels return instead of waiting forever for a peer.
    Status failure = async != ncclSuccess
                         ? ncclStatus(front->work->description(), async)
                     : expired ? Status(StatusCode::kDeadlineExceeded,
                                        fmt::format("{}: not complete after {} s (the watchdog's timeout)",
                                                    front->work->description(), options_.operationTimeout.count() / 1000.0))
                               : internalError("{}: CUDA {}", front->work->description(), cudaGetErrorString(state));
    std::deque<Pending> failed;
    {
      std::lock_guard launching(launchMu_);
      std::lock_guard lock(mu_);
      broken_ = failure;
      failed_->store(true);
      ncclCommAbort(comm_);
      failed.swap(pending_);
    }
    // The aborted kernels return; until they have, the tensors they use stay held, or the
    // allocator could hand that memory to the compute stream under them.
    cudaStreamSynchronize(stream_.stream());
    for (auto& f : failed) {
      if (f.start) cudaEventDestroy(f.start);
      f.work->complete(&f == &failed.front() ? failure
                                              : Status(failure.code(), f.work->description() +
                                                                           ": not run, the communicator failed: " +
                                                                           failure.message()));
    }
  }
}

std::shared_ptr<Work> NcclCommunicator::allReduce(at::Tensor t, ReduceOp op) {
  ncclDataType_t type = ncclFloat32;
  Status valid = checkCuda(t, device_, "the", &type);
  if (valid.isOk()) valid = checkReducible(t.scalar_type(), op);
  return run("all_reduce", describe(t) + " " + reduceOpName(op), t.defined() ? t.nbytes() : 0, {t}, valid,
             [&](cudaStream_t s) { return ncclAllReduce(t.data_ptr(), t.data_ptr(), t.numel(), type, ncclOp(op), comm_, s); });
}

std::shared_ptr<Work> NcclCommunicator::reduceScatter(at::Tensor output, at::Tensor input, ReduceOp op) {
  ncclDataType_t type = ncclFloat32;
  Status valid = checkCuda(output, device_, "the output", nullptr);
  if (valid.isOk()) valid = checkCuda(input, device_, "the input", &type);
  if (valid.isOk() && (input.scalar_type() != output.scalar_type() || input.numel() != output.numel() * size_))
    valid = invalidArgument("the input must hold {} times the output's elements of its dtype", size_);
  return run("reduce_scatter", describe(input), input.defined() ? input.nbytes() : 0, {output, input}, valid,
             [&](cudaStream_t s) {
               return ncclReduceScatter(input.data_ptr(), output.data_ptr(), output.numel(), type, ncclOp(op), comm_, s);
             });
}

std::shared_ptr<Work> NcclCommunicator::allGather(at::Tensor output, at::Tensor input) {
  ncclDataType_t type = ncclFloat32;
  Status valid = checkCuda(output, device_, "the output", nullptr);
  if (valid.isOk()) valid = checkCuda(input, device_, "the input", &type);
  if (valid.isOk() && (input.scalar_type() != output.scalar_type() || output.numel() != input.numel() * size_))
    valid = invalidArgument("the output must hold {} times the input's elements of its dtype", size_);
  return run("all_gather", describe(output), output.defined() ? output.nbytes() : 0, {output, input}, valid,
             [&](cudaStream_t s) { return ncclAllGather(input.data_ptr(), output.data_ptr(), input.numel(), type, comm_, s); });
}

std::shared_ptr<Work> NcclCommunicator::allToAll(at::Tensor output, at::Tensor input) {
  if (input.defined() && output.defined() && (input.numel() % size_ != 0 || output.numel() != input.numel())) {
    auto work = std::make_shared<Work>(fmt::format("all_to_all on {} ({} ranks, NCCL), {}", name_, size_, describe(input)));
    work->complete(invalidArgument("{}: input and output must hold the same number of elements, divisible by {}: "
                                   "input {}, output {}",
                                   work->description(), size_, input.numel(), output.numel()));
    return work;
  }
  const int64_t part = input.defined() ? input.numel() / size_ : 0;
  std::vector<int64_t> splits(size_, part);
  return allToAllV(output, input, splits, splits);
}

std::shared_ptr<Work> NcclCommunicator::allToAllV(at::Tensor output, at::Tensor input, std::vector<int64_t> outSplits,
                                                  std::vector<int64_t> inSplits) {
  ncclDataType_t type = ncclFloat32;
  Status valid = checkCuda(output, device_, "the output", nullptr);
  if (valid.isOk()) valid = checkCuda(input, device_, "the input", &type);
  if (valid.isOk() && (static_cast<int>(outSplits.size()) != size_ || static_cast<int>(inSplits.size()) != size_))
    valid = invalidArgument("splits must have {} entries, got {} output and {} input", size_, outSplits.size(),
                            inSplits.size());
  int64_t outTotal = 0, inTotal = 0;
  for (size_t i = 0; i < outSplits.size() && i < inSplits.size(); ++i) {
    if (valid.isOk() && (outSplits[i] < 0 || inSplits[i] < 0)) valid = invalidArgument("split {} is negative", i);
  }
  for (auto x : outSplits) outTotal += x;
  for (auto x : inSplits) inTotal += x;
  if (valid.isOk() && (outTotal != output.numel() || inTotal != input.numel()))
    valid = invalidArgument("splits add up to {} output and {} input elements, the tensors hold {} and {}", outTotal,
                            inTotal, output.numel(), input.numel());
  return run("all_to_all_v", describe(input), input.defined() ? input.nbytes() : 0, {output, input}, valid,
             [&](cudaStream_t s) {
               const size_t elem = input.element_size();
               auto* in = static_cast<char*>(input.data_ptr());
               auto* out = static_cast<char*>(output.data_ptr());
               int64_t inOff = 0, outOff = 0;
               ncclGroupStart();
               for (int j = 0; j < size_; ++j) {
                 ncclSend(in + inOff * elem, inSplits[j], type, j, comm_, s);
                 ncclRecv(out + outOff * elem, outSplits[j], type, j, comm_, s);
                 inOff += inSplits[j];
                 outOff += outSplits[j];
               }
               return ncclGroupEnd();
             });
}

std::shared_ptr<Work> NcclCommunicator::broadcast(at::Tensor t, int root) {
  ncclDataType_t type = ncclFloat32;
  Status valid = checkCuda(t, device_, "the", &type);
  if (valid.isOk() && (root < 0 || root >= size_)) valid = invalidArgument("root {} is not a rank of {}", root, name_);
  return run("broadcast", describe(t), t.defined() ? t.nbytes() : 0, {t}, valid,
             [&](cudaStream_t s) { return ncclBroadcast(t.data_ptr(), t.data_ptr(), t.numel(), type, root, comm_, s); });
}

std::shared_ptr<Work> NcclCommunicator::send(at::Tensor t, int peer, int tag) {
  return pointToPoint(/*sending=*/true, std::move(t), peer);
}

std::shared_ptr<Work> NcclCommunicator::recv(at::Tensor t, int peer, int tag) {
  return pointToPoint(/*sending=*/false, std::move(t), peer);
}

// NCCL matches point-to-point messages by order, not by tag.
std::shared_ptr<Work> NcclCommunicator::pointToPoint(bool sending, at::Tensor t, int peer) {
  ncclDataType_t type = ncclFloat32;
  Status valid = checkCuda(t, device_, "the", &type);
  if (valid.isOk() && (peer < 0 || peer >= size_ || peer == rank_))
    valid = invalidArgument("peer {} is not another rank of {}", peer, name_);
  return run(sending ? "send" : "recv", describe(t), t.defined() ? t.nbytes() : 0, {t}, valid, [&](cudaStream_t s) {
    return sending ? ncclSend(t.data_ptr(), t.numel(), type, peer, comm_, s)
                   : ncclRecv(t.data_ptr(), t.numel(), type, peer, comm_, s);
  });
}

std::shared_ptr<Work> NcclCommunicator::barrier() {
  // An all-reduce of one element on this rank's device, as c10d does.
  c10::cuda::CUDAGuard guard(device_);
  at::Tensor one = at::zeros({1}, at::TensorOptions().dtype(at::kFloat).device(at::kCUDA, device_));
  return run("barrier", "4 B", 4, {one}, Status::ok(),
             [&](cudaStream_t s) { return ncclAllReduce(one.data_ptr(), one.data_ptr(), 1, ncclFloat32, ncclSum, comm_, s); });
}

at::Tensor NcclCommunicator::allocate(at::IntArrayRef sizes, at::ScalarType dtype) {
  return at::empty(sizes, at::TensorOptions().dtype(dtype).device(at::kCUDA, device_));
}

StatusOr<std::shared_ptr<Communicator>> NcclCommunicator::split(const std::vector<int>& ranks, const std::string& name) {
  splits_.fetch_add(1);
  std::lock_guard launching(launchMu_);
  {
    std::lock_guard lock(mu_);
    if (!broken_.isOk()) return Status(broken_.code(), "split of " + name_ + ": the communicator failed earlier: " + broken_.message());
  }
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (ranks[i] < 0 || ranks[i] >= size_ || (i > 0 && ranks[i] <= ranks[i - 1]))
      return invalidArgument("split of {}: ranks must be ascending ranks of {} (0 to {})", name_, name_, size_ - 1);
  }
  auto it = std::find(ranks.begin(), ranks.end(), rank_);
  const bool member = it != ranks.end();
  ncclComm_t child = nullptr;
  c10::cuda::CUDAGuard guard(device_);
  RETURN_IF_ERROR(ncclStatus("ncclCommSplit", ncclCommSplit(comm_, member ? 0 : NCCL_SPLIT_NOCOLOR,
                                                            member ? static_cast<int>(it - ranks.begin()) : 0,
                                                            &child, nullptr)));
  if (!member) return std::shared_ptr<Communicator>();
  return std::shared_ptr<Communicator>(new NcclCommunicator(child, static_cast<int>(it - ranks.begin()),
                                                            static_cast<int>(ranks.size()), device_, name, options_));
}

}  // namespace loom::backends
