#pragma once

#include <atomic>
#include <mutex>
#include <memory>
#include <string>
#include <vector>

#include "backends/communicator.h"
#include "backends/ucx/ucx_transport.h"

namespace loom::backends {

// Collectives on host tensors over a UcxTransport. When every rank's tensors of a collective lie
// in the host's shared heap (allocate()), the ranks read and write each other's tensors in place
// (ucx_in_place.cc). Otherwise messages carry the data, by algorithms chosen by size: small
// all-reduces send every buffer to every rank and reduce in rank order; large ones run a chunked
// ring (reduce-scatter, then all-gather); broadcasts go direct when small and down a pipelined
// chain when large. Every rank ends with bit-identical results.
class UcxCommunicator final : public Communicator {
 public:
  // The communicator of every rank of the transport.
  static std::shared_ptr<UcxCommunicator> world(std::shared_ptr<UcxTransport> transport);
  // Waits until the operations already issued have run: they refer to this communicator, and the
  // transport must never be destroyed from its own thread.
  ~UcxCommunicator() override;

  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(ranks_.size()); }
  const std::string& name() const override { return name_; }

  std::shared_ptr<Work> allReduce(at::Tensor tensor, ReduceOp op) override;
  std::shared_ptr<Work> reduceScatter(at::Tensor output, at::Tensor input, ReduceOp op) override;
  std::shared_ptr<Work> allGather(at::Tensor output, at::Tensor input) override;
  std::shared_ptr<Work> allToAll(at::Tensor output, at::Tensor input) override;
  std::shared_ptr<Work> allToAllV(at::Tensor output, at::Tensor input, std::vector<int64_t> outputSplits,
                                  std::vector<int64_t> inputSplits) override;
  std::shared_ptr<Work> broadcast(at::Tensor tensor, int root) override;
  std::shared_ptr<Work> send(at::Tensor tensor, int peer, int tag) override;
  std::shared_ptr<Work> recv(at::Tensor tensor, int peer, int tag) override;
  std::shared_ptr<Work> barrier() override;
  StatusOr<std::shared_ptr<Communicator>> split(const std::vector<int>& ranks, const std::string& name) override;
  at::Tensor allocate(at::IntArrayRef sizes, at::ScalarType dtype) override;

 private:
  UcxCommunicator(std::shared_ptr<UcxTransport> transport, std::vector<int> worldRanks, uint32_t groupId,
                  std::string name);

  // Validation failures complete the Work at once; otherwise `body` runs on the transport thread.
  std::shared_ptr<Work> submit(const char* op, const std::string& detail, int64_t bytes, const Status& valid,
                               std::function<Status(uint32_t sequence)> body);
  uint64_t tagFrom(int groupRank, uint32_t sequence, uint32_t part) const;
  std::shared_ptr<Work> pointToPoint(bool sending, at::Tensor tensor, int peer, int tag);

  Status directAllReduce(char* data, int64_t count, at::ScalarType dtype, ReduceOp op, uint32_t seq);
  Status ringReduceScatter(const char* input, char* work, char* finalPart, const std::vector<int64_t>& bounds,
                           at::ScalarType dtype, ReduceOp op, uint32_t seq, bool endOnOwnPart);
  Status ringAllGather(char* data, const std::vector<int64_t>& bounds, size_t elementSize, uint32_t seq,
                       bool startFromOwnPart);
  Status exchange(char* output, const std::vector<int64_t>& outBounds, const char* input,
                  const std::vector<int64_t>& inBounds, uint32_t seq);
  Status chainBroadcast(char* data, int64_t bytes, int root, uint32_t seq);

  // In place through the shared heap (ucx_in_place.cc). A round: every rank publishes where its
  // tensor lies and learns where the others' do; the op runs in place when the tensors it reads
  // lie in the heap on every rank (all ranks see the same entries, so they all decide alike);
  // then every rank waits for all to leave, as the caller may reuse its tensors at once.
  struct SharedTensors {
    std::vector<char*> data;     // by group rank; null where the tensor is not in the heap
    std::vector<int64_t> bytes;  // by group rank
    bool everywhere() const;
  };
  // Enters the running collective's round with `mine`. The tensors that decide are every rank's, or only
  // `decidingRank`'s (a broadcast's root). `data` is empty without a heap, and when this rank's
  // tensor decides and is not in the heap (it does not wait for the others then).
  StatusOr<SharedTensors> enterShared(const at::Tensor& mine, int decidingRank = -1);
  Status leaveShared();
  // Leaves the round whatever `done` says (the others must not wait for this rank until their
  // deadline), then returns `done`'s error first.
  Status leaveSharedAfter(const Status& done);
  // While a rank waits in the heap, its UCX worker keeps moving the messages of earlier operations.
  SharedHeap::WaitHooks waitHooks() const;
  Status asOperationError(const Status& heapError) const;
  // The tensors of ranks `which` (every rank when empty) hold `bytes`, or an error naming the
  // first that does not (after leaving the round, so that the others are not held up).
  Status sameBytes(const SharedTensors& shared, int64_t bytes, const std::vector<int>& which = {});
  Status sharedAllReduce(const SharedTensors& tensors, int64_t count, at::ScalarType dtype, ReduceOp op);
  Status sharedReduceScatter(const SharedTensors& inputs, char* output, int64_t part, at::ScalarType dtype, ReduceOp op);
  void sharedGather(const SharedTensors& inputs, char* output, int64_t partBytes, int64_t sourceOffset);
  // all_to_all_v in place: a rank cannot know where in a peer's input its part starts (the peer's
  // splits), so each round publishes a small block of this communicator's own in the heap instead
  // of the input: the input's place in the segment and its part bounds in bytes. When every
  // rank's input lies in the heap, each copies its parts straight from the peers' inputs; false
  // (after leaving the round) when some rank's does not, and the op goes over messages on every
  // rank alike.
  StatusOr<bool> sharedAllToAllV(const at::Tensor& input, char* output, const std::vector<int64_t>& outBounds,
                                 const std::vector<int64_t>& inBounds);
  void sharedCopy(char* to, const char* from, int64_t bytes);

  std::shared_ptr<UcxTransport> transport_;
  std::vector<int> ranks_;  // world rank of each rank of this group
  int rank_;
  uint32_t groupId_;
  std::string name_;
  std::mutex submitMu_;  // numbering and queueing are one step, so the queue is in sequence order
  uint64_t submitted_ = 0;  // collectives called, refused ones too; their sequence numbers and rounds
  std::atomic<uint32_t> splits_{0};
  uint64_t sharedRound_ = 0;  // the running collective's round; on the transport thread only
  at::Tensor sharedBounds_;   // sharedAllToAllV's published block; on the transport thread only
};

}  // namespace loom::backends
