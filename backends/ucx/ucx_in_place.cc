// UcxCommunicator's collectives on tensors in the host's shared heap (shared_heap.h): every rank
// maps every other's tensors, so a collective is one pass over memory with no messages. An
// all-reduce of 2 ranks reads both tensors once and writes both once; over messages the same
// bytes are copied into a receive buffer first and the result copied back out.
#include <cstdio>
#include <mutex>

#include <ATen/ATen.h>
#include <fmt/format.h>

#include "backends/reduce.h"
#include "backends/ucx/ucx_communicator.h"

namespace loom::backends {

namespace {

// From this many bytes written, stores bypass the cache: the data will be in memory, not the
// cache, when it is next read, and streaming stores save reading the destination first.
constexpr int64_t kStreamingBytes = 16 << 20;

}  // namespace

at::Tensor UcxCommunicator::allocate(at::IntArrayRef sizes, at::ScalarType dtype) {
  const auto options = at::TensorOptions().dtype(dtype);
  const std::shared_ptr<SharedHeap>& heap = transport_->heap();
  if (!heap) return at::empty(sizes, options);
  const size_t bytes = static_cast<size_t>(c10::multiply_integers(sizes)) * c10::elementSize(dtype);
  auto memory = heap->allocate(bytes);
  if (!memory.isOk()) {
    static std::once_flag warned;
    std::call_once(warned, [&] {
      std::fprintf(stderr,
                   "warning: %s; tensors for collectives come from ordinary memory from now on, and collectives on "
                   "them go over UCX messages (a container needs a larger /dev/shm)\n",
                   memory.status().message().c_str());
    });
    return at::empty(sizes, options);
  }
  return at::from_blob(*memory, sizes, [heap](void* p) { heap->release(p); }, options);
}

bool UcxCommunicator::SharedTensors::everywhere() const {
  if (data.empty()) return false;
  for (char* d : data)
    if (!d) return false;
  return true;
}

StatusOr<UcxCommunicator::SharedTensors> UcxCommunicator::enterShared(const at::Tensor& mine, int decidingRank) {
  SharedHeap* heap = transport_->heap().get();
  if (!heap) return SharedTensors{};
  const uint64_t round = sharedRound_;
  const int64_t bytes = static_cast<int64_t>(mine.nbytes());
  const int64_t offset = heap->offsetOf(mine.data_ptr(), mine.nbytes());
  heap->enter(groupId_, round, {offset, bytes});
  // When this rank's tensor decides and is not in the heap, the op goes over messages whatever
  // the others hold: no need to wait for them.
  if (offset < 0 && (decidingRank < 0 || decidingRank == rank_)) return SharedTensors{};
  RETURN_IF_ERROR(asOperationError(heap->awaitEntered(groupId_, ranks_, round, transport_->deadline(),
                                                      "every rank to start in shared memory", waitHooks())));
  SharedTensors shared;
  for (int q = 0; q < size(); ++q) {
    const SharedHeap::Entry e = heap->entryOf(ranks_[q], groupId_, round);
    shared.data.push_back(e.offset < 0 ? nullptr : heap->segment(ranks_[q]) + e.offset);
    shared.bytes.push_back(e.bytes);
  }
  return shared;
}

Status UcxCommunicator::leaveShared() {
  SharedHeap* heap = transport_->heap().get();
  const uint64_t round = sharedRound_;
  heap->leave(groupId_, round);
  return asOperationError(heap->awaitLeft(groupId_, ranks_, round, transport_->deadline(),
                                          "every rank to finish in shared memory", waitHooks()));
}

Status UcxCommunicator::leaveSharedAfter(const Status& done) {
  Status left = leaveShared();
  return done.isOk() ? left : done;
}

// The heap's errors in the words of the transport's: the operation first, and a deadline as the
// watchdog's.
Status UcxCommunicator::asOperationError(const Status& s) const {
  if (s.isOk()) return s;
  if (s.code() == StatusCode::kDeadlineExceeded) return transport_->overdue(s.message());
  return Status(s.code(), fmt::format("{}: {}", transport_->currentOperation(), s.message()));
}

SharedHeap::WaitHooks UcxCommunicator::waitHooks() const {
  UcxTransport* t = transport_.get();
  return {[t] { t->poll(); }, [t] { return t->flush(); }};
}

Status UcxCommunicator::sameBytes(const SharedTensors& shared, int64_t bytes, const std::vector<int>& which) {
  std::vector<int> ranks = which;
  if (ranks.empty())
    for (int q = 0; q < size(); ++q) ranks.push_back(q);
  for (int q : ranks) {
    if (shared.bytes[q] == bytes) continue;
    RETURN_IF_ERROR(leaveShared());
    return invalidArgument("rank {}'s tensor holds {} bytes, this rank's {} ({})", q, shared.bytes[q], bytes,
                           transport_->currentOperation());
  }
  return Status::ok();
}

// Each rank reduces its share (evenBounds) out of every rank's tensor and writes the result into
// all of them.
Status UcxCommunicator::sharedAllReduce(const SharedTensors& tensors, int64_t count, at::ScalarType dtype, ReduceOp op) {
  const int64_t elem = static_cast<int64_t>(c10::elementSize(dtype));
  const int64_t begin = count * rank_ / size(), end = count * (rank_ + 1) / size();
  std::vector<const char*> sources;
  std::vector<char*> destinations;
  for (char* t : tensors.data) {
    sources.push_back(t + begin * elem);
    destinations.push_back(t + begin * elem);
  }
  // Ordinary stores: each line written was just read, so it is in the cache already, where a
  // streaming store would first have to evict it (measured 2-3x slower for this pattern).
  return reduceToAll(sources, destinations, end - begin, dtype, op, /*streaming=*/false);
}

Status UcxCommunicator::sharedReduceScatter(const SharedTensors& inputs, char* output, int64_t part,
                                            at::ScalarType dtype, ReduceOp op) {
  const int64_t elem = static_cast<int64_t>(c10::elementSize(dtype));
  std::vector<const char*> sources;
  for (char* in : inputs.data) sources.push_back(in + rank_ * part * elem);
  return reduceToAll(sources, {output}, part, dtype, op, part * elem * size() >= kStreamingBytes);
}

// output part q = `partBytes` of rank q's input from `sourceOffset`; starting with the next rank,
// so that the ranks do not all read rank 0 first.
void UcxCommunicator::sharedGather(const SharedTensors& inputs, char* output, int64_t partBytes, int64_t sourceOffset) {
  const bool streaming = partBytes * size() >= kStreamingBytes;
  for (int k = 0; k < size(); ++k) {
    const int q = (rank_ + 1 + k) % size();
    copyBytes(output + q * partBytes, inputs.data[q] + sourceOffset, partBytes, streaming);
  }
}

StatusOr<bool> UcxCommunicator::sharedAllToAllV(const at::Tensor& input, char* output,
                                                const std::vector<int64_t>& outBounds,
                                                const std::vector<int64_t>& inBounds) {
  SharedHeap* heap = transport_->heap().get();
  if (!heap) return false;
  // [input offset in this rank's segment (-1: not there), its part bounds...], in bytes.
  const int n = size();
  if (!sharedBounds_.defined()) sharedBounds_ = allocate({n + 2}, at::kLong);
  int64_t* mine = sharedBounds_.data_ptr<int64_t>();
  mine[0] = heap->offsetOf(input.data_ptr(), input.nbytes());
  for (int q = 0; q <= n; ++q) mine[q + 1] = inBounds[q];
  ASSIGN_OR_RETURN(SharedTensors shared, enterShared(sharedBounds_));
  if (!shared.everywhere()) return false;  // every rank sees it so, and none waits in the heap
  std::vector<const int64_t*> blocks;
  bool inPlace = true;
  for (int q = 0; q < n; ++q) {
    blocks.push_back(reinterpret_cast<const int64_t*>(shared.data[q]));
    inPlace = inPlace && blocks.back()[0] >= 0;
  }
  Status status;
  if (inPlace) {
    // Peer q's part for this rank is [bounds_q[rank], bounds_q[rank + 1]) of its input, and must
    // be as long as this rank's output part from q.
    for (int k = 0; k < n && status.isOk(); ++k) {
      const int q = (rank_ + 1 + k) % n;
      const int64_t begin = blocks[q][1 + rank_], bytes = blocks[q][2 + rank_] - begin;
      if (bytes != outBounds[q + 1] - outBounds[q]) {
        status = invalidArgument("all_to_all_v: rank {} sends {} bytes to rank {}, which expects {}", q, bytes, rank_,
                                 outBounds[q + 1] - outBounds[q]);
        break;
      }
      sharedCopy(output + outBounds[q], heap->segment(ranks_[q]) + blocks[q][0] + begin, bytes);
    }
  }
  RETURN_IF_ERROR(leaveSharedAfter(status));
  return inPlace;
}

void UcxCommunicator::sharedCopy(char* to, const char* from, int64_t bytes) {
  copyBytes(to, from, bytes, bytes >= kStreamingBytes);
}

}  // namespace loom::backends
