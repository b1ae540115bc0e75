#include "backends/ucx/ucx_communicator.h"

#include <algorithm>
#include <cstring>

#include <fmt/format.h>

#include "backends/reduce.h"
#include "common/human_bytes.h"

namespace loom::backends {

namespace {

constexpr int64_t kDirectAllReduceBytes = 64 * 1024;  // below: every buffer to every rank
constexpr int64_t kDirectBroadcastBytes = 256 * 1024;
constexpr int64_t kChunkBytes = 1 << 20;              // ring and chain pipelining unit
constexpr int64_t kReceiveSlots = 4;                   // reduce-scatter chunks in flight from the left

std::string describe(const at::Tensor& t) {
  return fmt::format("{} {}", humanBytes(t.defined() ? static_cast<int64_t>(t.nbytes()) : 0),
                     t.defined() ? c10::toString(t.scalar_type()) : "undefined");
}

Status checkTensor(const at::Tensor& t, const char* which) {
  if (!t.defined()) return invalidArgument("{} tensor is undefined", which);
  if (!t.device().is_cpu()) return invalidArgument("{} tensor is on {}: the UCX backend takes host tensors", which, t.device().str());
  if (!t.is_contiguous()) return invalidArgument("{} tensor is not contiguous", which);
  return Status::ok();
}

// Boundaries (in elements) of `parts` equal parts of `count` elements; the last parts are the
// smaller ones when it does not divide.
std::vector<int64_t> evenBounds(int64_t count, int parts) {
  std::vector<int64_t> b(parts + 1);
  for (int i = 0; i <= parts; ++i) b[i] = count * i / parts;
  return b;
}

std::vector<int64_t> boundsFromSplits(const std::vector<int64_t>& splits) {
  std::vector<int64_t> b(splits.size() + 1, 0);
  for (size_t i = 0; i < splits.size(); ++i) b[i + 1] = b[i] + splits[i];
  return b;
}

}  // namespace

std::shared_ptr<UcxCommunicator> UcxCommunicator::world(std::shared_ptr<UcxTransport> transport) {
  std::vector<int> ranks(transport->worldSize());
  for (int r = 0; r < transport->worldSize(); ++r) ranks[r] = r;
  return std::shared_ptr<UcxCommunicator>(new UcxCommunicator(std::move(transport), std::move(ranks), 0, "world"));
}

UcxCommunicator::UcxCommunicator(std::shared_ptr<UcxTransport> transport, std::vector<int> worldRanks,
                                 uint32_t groupId, std::string name)
    : transport_(std::move(transport)), ranks_(std::move(worldRanks)), groupId_(groupId), name_(std::move(name)) {
  rank_ = static_cast<int>(std::find(ranks_.begin(), ranks_.end(), transport_->rank()) - ranks_.begin());
}

UcxCommunicator::~UcxCommunicator() {
  auto fence = std::make_shared<Work>("the end of " + name_);
  transport_->enqueue(fence, "", 0, size(), [] { return Status::ok(); });
  (void)fence->wait();
}

uint64_t UcxCommunicator::tagFrom(int groupRank, uint32_t sequence, uint32_t part) const {
  return makeTag(groupId_, groupRank, sequence, part);
}

std::shared_ptr<Work> UcxCommunicator::submit(const char* op, const std::string& detail, int64_t bytes,
                                              const Status& valid, std::function<Status(uint32_t)> body) {
  // Collectives number themselves in call order, which is the same on every rank; 0xFFFFFF is
  // left to point-to-point messages.
  std::lock_guard lock(submitMu_);
  // The shared heap's round is the collective's number too (not wrapped), taken even when this
  // rank refuses the call: ranks that disagree then meet in different rounds and time out, rather
  // than pair one rank's call with another's next one.
  const uint64_t round = submitted_++;
  uint32_t seq = static_cast<uint32_t>(round % kPointToPointSequence);
  auto work = std::make_shared<Work>(fmt::format("{} #{} on {} ({} ranks), {}", op, seq, name_, size(), detail));
  if (!valid.isOk()) {
    work->complete(valid.withContext(work->description()));
    return work;
  }
  transport_->enqueue(work, op, bytes, size(), [this, body = std::move(body), seq, round] {
    sharedRound_ = round;
    return body(seq);
  });
  return work;
}

// ---- all-reduce ---------------------------------------------------------------------------

std::shared_ptr<Work> UcxCommunicator::allReduce(at::Tensor t, ReduceOp op) {
  Status valid = checkTensor(t, "the");
  if (valid.isOk()) valid = checkReducible(t.scalar_type(), op);
  return submit("all_reduce", describe(t) + " " + reduceOpName(op), t.defined() ? t.nbytes() : 0, valid,
                [this, t, op](uint32_t seq) -> Status {
                  const int64_t count = t.numel();
                  char* data = static_cast<char*>(t.data_ptr());
                  if (size() == 1 || count == 0) return Status::ok();
                  ASSIGN_OR_RETURN(SharedTensors shared, enterShared(t));
                  if (shared.everywhere()) {
                    RETURN_IF_ERROR(sameBytes(shared, t.nbytes()));
                    return leaveSharedAfter(sharedAllReduce(shared, count, t.scalar_type(), op));
                  }
                  if (static_cast<int64_t>(t.nbytes()) <= kDirectAllReduceBytes || count < size()) {
                    RETURN_IF_ERROR(directAllReduce(data, count, t.scalar_type(), op, seq));
                  } else {
                    auto bounds = evenBounds(count, size());
                    RETURN_IF_ERROR(ringReduceScatter(data, data, nullptr, bounds, t.scalar_type(), op, seq, false));
                    RETURN_IF_ERROR(ringAllGather(data, bounds, t.element_size(), seq, false));
                  }
                  return op == ReduceOp::kAvg ? finishAverage(data, count, t.scalar_type(), size()) : Status::ok();
                });
}

// Every rank sends its buffer to every other and reduces all of them in rank order, so the
// result is the same bits everywhere. For small buffers, where latency rules.
Status UcxCommunicator::directAllReduce(char* data, int64_t count, at::ScalarType dtype, ReduceOp op, uint32_t seq) {
  const int n = size();
  const size_t bytes = count * c10::elementSize(dtype);
  char* all = transport_->scratch(0, bytes * n);
  std::memcpy(all + rank_ * bytes, data, bytes);
  std::vector<UcxTransport::Request> requests;
  for (int j = 0; j < n; ++j) {
    if (j == rank_) continue;
    ASSIGN_OR_RETURN(auto recv, transport_->postReceive(ranks_[j], tagFrom(j, seq, 0), all + j * bytes, bytes,
                                                        fmt::format("the buffer of rank {}", j)));
    requests.push_back(std::move(recv));
    ASSIGN_OR_RETURN(auto send, transport_->postSend(ranks_[j], tagFrom(rank_, seq, 0), data, bytes,
                                                     fmt::format("sending to rank {}", j)));
    requests.push_back(std::move(send));
  }
  RETURN_IF_ERROR(transport_->waitAll(requests));
  std::memcpy(data, all, bytes);
  for (int j = 1; j < n; ++j) RETURN_IF_ERROR(reduceInto(data, all + j * bytes, count, dtype, op));
  return Status::ok();
}

// The ring reduce-scatter over parts [bounds[i], bounds[i+1]). At step s a rank sends the part it
// has accumulated so far to its right neighbour and combines the part coming from its left one
// with its own input, chunk by chunk as the chunks arrive. It ends holding part (rank + 1) % n
// fully reduced, or its own part when `endOnOwnPart`. Step 0 sends straight from `input`;
// partial sums go to `work` (which may be `input`: in place); the last step writes to
// `finalPart` when given. So the input is never copied.
Status UcxCommunicator::ringReduceScatter(const char* input, char* work, char* finalPart,
                                          const std::vector<int64_t>& bounds, at::ScalarType dtype, ReduceOp op,
                                          uint32_t seq, bool endOnOwnPart) {
  const int n = size();
  const size_t elem = c10::elementSize(dtype);
  const int left = (rank_ - 1 + n) % n, right = (rank_ + 1) % n;
  const int shift = endOnOwnPart ? n - 1 : 0;
  const int64_t chunkElems = std::max<int64_t>(1, kChunkBytes / static_cast<int64_t>(elem));
  // The chunks from the left land in a few slots that are used again and again, so that they are
  // still in the cache when they are combined: one pass over memory for the reduction, not two.
  int64_t largest = 0;
  for (int i = 0; i < n; ++i) largest = std::max(largest, bounds[i + 1] - bounds[i]);
  const int64_t slots = std::max<int64_t>(1, std::min<int64_t>(kReceiveSlots, (largest + chunkElems - 1) / chunkElems));
  char* incoming = transport_->scratch(0, slots * chunkElems * elem);
  uint32_t sendPart = 0, recvPart = 0;
  for (int s = 0; s < n - 1; ++s) {
    const int sendIdx = (rank_ - s + shift + 2 * n) % n;
    const int recvIdx = (rank_ - s - 1 + shift + 2 * n) % n;
    std::vector<std::pair<int64_t, int64_t>> recvChunks;  // (offset in the part, elements)
    for (int64_t off = 0; off < bounds[recvIdx + 1] - bounds[recvIdx]; off += chunkElems)
      recvChunks.push_back({off, std::min(chunkElems, bounds[recvIdx + 1] - bounds[recvIdx] - off)});
    std::vector<UcxTransport::Request> recvs(recvChunks.size());
    auto postReceive = [&](size_t c) -> Status {
      ASSIGN_OR_RETURN(recvs[c], transport_->postReceive(ranks_[left], tagFrom(left, seq, recvPart++),
                                                         incoming + (c % slots) * chunkElems * elem,
                                                         recvChunks[c].second * elem,
                                                         fmt::format("step {} of the reduce-scatter ring from rank {}", s, left)));
      return Status::ok();
    };
    for (size_t c = 0; c < recvChunks.size() && c < static_cast<size_t>(slots); ++c) RETURN_IF_ERROR(postReceive(c));
    std::vector<UcxTransport::Request> sends;
    for (int64_t off = 0; off < bounds[sendIdx + 1] - bounds[sendIdx]; off += chunkElems) {
      int64_t len = std::min(chunkElems, bounds[sendIdx + 1] - bounds[sendIdx] - off);
      const char* from = (s == 0 ? input : work) + (bounds[sendIdx] + off) * elem;
      ASSIGN_OR_RETURN(auto r, transport_->postSend(ranks_[right], tagFrom(rank_, seq, sendPart++), from, len * elem,
                                                    fmt::format("step {} of the reduce-scatter ring to rank {}", s, right)));
      sends.push_back(std::move(r));
    }
    const bool last = s == n - 2;
    char* into = last && finalPart ? finalPart : work + bounds[recvIdx] * elem;
    for (size_t c = 0; c < recvChunks.size(); ++c) {
      std::vector<UcxTransport::Request> one{std::move(recvs[c])};
      RETURN_IF_ERROR(transport_->waitAll(one));
      auto [off, len] = recvChunks[c];
      RETURN_IF_ERROR(combine(into + off * elem, input + (bounds[recvIdx] + off) * elem,
                              incoming + (c % slots) * chunkElems * elem, len, dtype, op));
      // Its slot is free again: the chunk `slots` further on lands there.
      if (c + slots < recvChunks.size()) RETURN_IF_ERROR(postReceive(c + slots));
    }
    RETURN_IF_ERROR(transport_->waitAll(sends));
  }
  return Status::ok();
}

// The ring all-gather: a rank starts holding part (rank + 1) % n (after a reduce-scatter), or
// its own part when `startFromOwnPart`, and passes parts to the right for n - 1 steps.
Status UcxCommunicator::ringAllGather(char* data, const std::vector<int64_t>& bounds, size_t elem, uint32_t seq,
                                      bool startFromOwnPart) {
  const int n = size();
  const int left = (rank_ - 1 + n) % n, right = (rank_ + 1) % n;
  const int shift = startFromOwnPart ? n - 1 : 0;
  const int64_t chunkElems = std::max<int64_t>(1, kChunkBytes / static_cast<int64_t>(elem));
  // Parts numbered on from the reduce-scatter's so that both phases can share the sequence.
  uint32_t sendPart = 0x800, recvPart = 0x800;
  for (int s = 0; s < n - 1; ++s) {
    const int sendIdx = (rank_ + 1 - s + shift + 2 * n) % n;
    const int recvIdx = (rank_ - s + shift + 2 * n) % n;
    std::vector<UcxTransport::Request> requests;
    for (int64_t off = 0; off < bounds[recvIdx + 1] - bounds[recvIdx]; off += chunkElems) {
      int64_t len = std::min(chunkElems, bounds[recvIdx + 1] - bounds[recvIdx] - off);
      ASSIGN_OR_RETURN(auto r, transport_->postReceive(ranks_[left], tagFrom(left, seq, recvPart++),
                                                       data + (bounds[recvIdx] + off) * elem, len * elem,
                                                       fmt::format("step {} of the all-gather ring from rank {}", s, left)));
      requests.push_back(std::move(r));
    }
    for (int64_t off = 0; off < bounds[sendIdx + 1] - bounds[sendIdx]; off += chunkElems) {
      int64_t len = std::min(chunkElems, bounds[sendIdx + 1] - bounds[sendIdx] - off);
      ASSIGN_OR_RETURN(auto r, transport_->postSend(ranks_[right], tagFrom(rank_, seq, sendPart++),
                                                    data + (bounds[sendIdx] + off) * elem, len * elem,
                                                    fmt::format("step {} of the all-gather ring to rank {}", s, right)));
      requests.push_back(std::move(r));
    }
    RETURN_IF_ERROR(transport_->waitAll(requests));
  }
  return Status::ok();
}

// ---- reduce-scatter, all-gather, all-to-all -----------------------------------------------

std::shared_ptr<Work> UcxCommunicator::reduceScatter(at::Tensor output, at::Tensor input, ReduceOp op) {
  Status valid = checkTensor(output, "the output");
  if (valid.isOk()) valid = checkTensor(input, "the input");
  if (valid.isOk()) valid = checkReducible(input.scalar_type(), op);
  if (valid.isOk() && (input.scalar_type() != output.scalar_type() || input.numel() != output.numel() * size()))
    valid = invalidArgument("the input must hold {} times the output's elements of its dtype: input {} ({}), output {} ({})",
                            size(), input.numel(), c10::toString(input.scalar_type()), output.numel(),
                            c10::toString(output.scalar_type()));
  return submit("reduce_scatter", describe(input) + " " + reduceOpName(op), input.defined() ? input.nbytes() : 0, valid,
                [this, output, input, op](uint32_t seq) -> Status {
                  const size_t bytes = output.nbytes();
                  if (size() == 1) {
                    std::memcpy(output.data_ptr(), input.data_ptr(), bytes);
                  } else {
                    ASSIGN_OR_RETURN(SharedTensors shared, enterShared(input));
                    if (shared.everywhere()) {
                      RETURN_IF_ERROR(sameBytes(shared, input.nbytes()));
                      // Averaged as it is reduced.
                      return leaveSharedAfter(sharedReduceScatter(shared, static_cast<char*>(output.data_ptr()),
                                                                  output.numel(), input.scalar_type(), op));
                    }
                    char* work = transport_->scratch(1, input.nbytes());
                    auto bounds = evenBounds(input.numel(), size());
                    RETURN_IF_ERROR(ringReduceScatter(static_cast<const char*>(input.data_ptr()), work,
                                                      static_cast<char*>(output.data_ptr()), bounds,
                                                      input.scalar_type(), op, seq, true));
                  }
                  return op == ReduceOp::kAvg ? finishAverage(output.data_ptr(), output.numel(), output.scalar_type(), size())
                                              : Status::ok();
                });
}

std::shared_ptr<Work> UcxCommunicator::allGather(at::Tensor output, at::Tensor input) {
  Status valid = checkTensor(output, "the output");
  if (valid.isOk()) valid = checkTensor(input, "the input");
  if (valid.isOk() && (input.scalar_type() != output.scalar_type() || output.numel() != input.numel() * size()))
    valid = invalidArgument("the output must hold {} times the input's elements of its dtype: input {} ({}), output {} ({})",
                            size(), input.numel(), c10::toString(input.scalar_type()), output.numel(),
                            c10::toString(output.scalar_type()));
  return submit("all_gather", describe(output), output.defined() ? output.nbytes() : 0, valid,
                [this, output, input](uint32_t seq) -> Status {
                  char* out = static_cast<char*>(output.data_ptr());
                  if (size() > 1) {
                    ASSIGN_OR_RETURN(SharedTensors shared, enterShared(input));
                    if (shared.everywhere()) {
                      RETURN_IF_ERROR(sameBytes(shared, input.nbytes()));
                      sharedGather(shared, out, input.nbytes(), 0);
                      return leaveShared();
                    }
                  }
                  std::memcpy(out + rank_ * input.nbytes(), input.data_ptr(), input.nbytes());
                  if (size() == 1) return Status::ok();
                  return ringAllGather(out, evenBounds(output.numel(), size()), output.element_size(), seq, true);
                });
}

// Pairwise exchange: every receive is posted, then every send; this rank's own part is copied.
Status UcxCommunicator::exchange(char* output, const std::vector<int64_t>& outBounds, const char* input,
                                 const std::vector<int64_t>& inBounds, uint32_t seq) {
  std::vector<UcxTransport::Request> requests;
  std::memcpy(output + outBounds[rank_], input + inBounds[rank_], outBounds[rank_ + 1] - outBounds[rank_]);
  for (int j = 0; j < size(); ++j) {
    if (j == rank_) continue;
    ASSIGN_OR_RETURN(auto r, transport_->postReceive(ranks_[j], tagFrom(j, seq, 0), output + outBounds[j],
                                                     outBounds[j + 1] - outBounds[j], fmt::format("the part from rank {}", j)));
    requests.push_back(std::move(r));
  }
  for (int k = 1; k < size(); ++k) {
    int j = (rank_ + k) % size();  // staggered, so that not every rank sends to rank 0 first
    ASSIGN_OR_RETURN(auto r, transport_->postSend(ranks_[j], tagFrom(rank_, seq, 0), input + inBounds[j],
                                                  inBounds[j + 1] - inBounds[j], fmt::format("sending the part for rank {}", j)));
    requests.push_back(std::move(r));
  }
  return transport_->waitAll(requests);
}

std::shared_ptr<Work> UcxCommunicator::allToAll(at::Tensor output, at::Tensor input) {
  Status valid = checkTensor(output, "the output");
  if (valid.isOk()) valid = checkTensor(input, "the input");
  if (valid.isOk() && (input.scalar_type() != output.scalar_type() || input.numel() != output.numel() ||
                       input.numel() % size() != 0))
    valid = invalidArgument("input and output must have the same dtype and a number of elements divisible by {}: "
                            "input {} ({}), output {} ({})",
                            size(), input.numel(), c10::toString(input.scalar_type()), output.numel(),
                            c10::toString(output.scalar_type()));
  return submit("all_to_all", describe(input), input.defined() ? input.nbytes() : 0, valid,
                [this, output, input](uint32_t seq) -> Status {
                  if (size() > 1) {
                    ASSIGN_OR_RETURN(SharedTensors shared, enterShared(input));
                    if (shared.everywhere()) {
                      RETURN_IF_ERROR(sameBytes(shared, input.nbytes()));
                      const int64_t part = input.nbytes() / size();
                      sharedGather(shared, static_cast<char*>(output.data_ptr()), part, rank_ * part);
                      return leaveShared();
                    }
                  }
                  auto b = evenBounds(input.numel(), size());
                  for (auto& x : b) x *= input.element_size();
                  return exchange(static_cast<char*>(output.data_ptr()), b, static_cast<const char*>(input.data_ptr()),
                                  b, seq);
                });
}

std::shared_ptr<Work> UcxCommunicator::allToAllV(at::Tensor output, at::Tensor input, std::vector<int64_t> outputSplits,
                                                 std::vector<int64_t> inputSplits) {
  Status valid = checkTensor(output, "the output");
  if (valid.isOk()) valid = checkTensor(input, "the input");
  if (valid.isOk() && input.scalar_type() != output.scalar_type())
    valid = invalidArgument("input ({}) and output ({}) dtypes differ", c10::toString(input.scalar_type()),
                            c10::toString(output.scalar_type()));
  if (valid.isOk() && (static_cast<int>(outputSplits.size()) != size() || static_cast<int>(inputSplits.size()) != size()))
    valid = invalidArgument("splits must have {} entries, got {} output and {} input", size(), outputSplits.size(),
                            inputSplits.size());
  auto outBounds = boundsFromSplits(outputSplits), inBounds = boundsFromSplits(inputSplits);
  if (valid.isOk() && (outBounds.back() != output.numel() || inBounds.back() != input.numel()))
    valid = invalidArgument("splits add up to {} output and {} input elements, the tensors hold {} and {}",
                            outBounds.back(), inBounds.back(), output.numel(), input.numel());
  if (valid.isOk()) {
    for (size_t i = 0; i < outputSplits.size(); ++i) {
      if (outputSplits[i] < 0 || inputSplits[i] < 0) valid = invalidArgument("split {} is negative", i);
    }
  }
  return submit("all_to_all_v", describe(input), input.defined() ? input.nbytes() : 0, valid,
                [this, output, input, outBounds, inBounds](uint32_t seq) mutable -> Status {
                  for (auto& x : outBounds) x *= output.element_size();
                  for (auto& x : inBounds) x *= input.element_size();
                  if (size() > 1) {
                    ASSIGN_OR_RETURN(bool done, sharedAllToAllV(input, static_cast<char*>(output.data_ptr()),
                                                                outBounds, inBounds));
                    if (done) return Status::ok();
                  }
                  return exchange(static_cast<char*>(output.data_ptr()), outBounds,
                                  static_cast<const char*>(input.data_ptr()), inBounds, seq);
                });
}

// ---- broadcast, point-to-point, barrier ---------------------------------------------------

std::shared_ptr<Work> UcxCommunicator::broadcast(at::Tensor t, int root) {
  Status valid = checkTensor(t, "the");
  if (valid.isOk() && (root < 0 || root >= size()))
    valid = invalidArgument("root {} is not a rank of {} ({} ranks)", root, name_, size());
  return submit("broadcast", describe(t) + fmt::format(" from rank {}", root), t.defined() ? t.nbytes() : 0, valid,
                [this, t, root](uint32_t seq) -> Status {
                  if (size() == 1) return Status::ok();
                  ASSIGN_OR_RETURN(SharedTensors shared, enterShared(t, root));
                  if (!shared.data.empty() && shared.data[root]) {
                    RETURN_IF_ERROR(sameBytes(shared, t.nbytes(), {root}));
                    if (rank_ != root) sharedCopy(static_cast<char*>(t.data_ptr()), shared.data[root], t.nbytes());
                    return leaveShared();
                  }
                  return chainBroadcast(static_cast<char*>(t.data_ptr()), t.nbytes(), root, seq);
                });
}

Status UcxCommunicator::chainBroadcast(char* data, int64_t bytes, int root, uint32_t seq) {
  const int n = size();
  std::vector<UcxTransport::Request> requests;
  if (bytes <= kDirectBroadcastBytes || n == 2) {
    if (rank_ == root) {
      for (int j = 0; j < n; ++j) {
        if (j == root) continue;
        ASSIGN_OR_RETURN(auto r, transport_->postSend(ranks_[j], tagFrom(root, seq, 0), data, bytes,
                                                      fmt::format("sending to rank {}", j)));
        requests.push_back(std::move(r));
      }
    } else {
      ASSIGN_OR_RETURN(auto r, transport_->postReceive(ranks_[root], tagFrom(root, seq, 0), data, bytes,
                                                       fmt::format("the data from root rank {}", root)));
      requests.push_back(std::move(r));
    }
    return transport_->waitAll(requests);
  }
  // A chain from the root: each rank forwards a chunk as soon as it has it.
  const int position = (rank_ - root + n) % n;
  const int prev = (rank_ - 1 + n) % n, next = (rank_ + 1) % n;
  const bool last = position == n - 1;
  std::vector<UcxTransport::Request> recvs, sends;
  uint32_t part = 0;
  if (position > 0) {
    for (int64_t off = 0; off < bytes; off += kChunkBytes) {
      ASSIGN_OR_RETURN(auto r, transport_->postReceive(ranks_[prev], tagFrom(prev, seq, part++), data + off,
                                                       std::min(kChunkBytes, bytes - off),
                                                       fmt::format("a chunk of the broadcast from rank {}", prev)));
      recvs.push_back(std::move(r));
    }
  }
  part = 0;
  size_t c = 0;
  for (int64_t off = 0; off < bytes; off += kChunkBytes, ++c) {
    if (position > 0) {
      std::vector<UcxTransport::Request> one{std::move(recvs[c])};
      RETURN_IF_ERROR(transport_->waitAll(one));
    }
    if (!last) {
      ASSIGN_OR_RETURN(auto s, transport_->postSend(ranks_[next], tagFrom(rank_, seq, part++), data + off,
                                                    std::min(kChunkBytes, bytes - off),
                                                    fmt::format("forwarding the broadcast to rank {}", next)));
      sends.push_back(std::move(s));
    }
  }
  return transport_->waitAll(sends);
}

std::shared_ptr<Work> UcxCommunicator::send(at::Tensor t, int peer, int tag) {
  return pointToPoint(/*sending=*/true, std::move(t), peer, tag);
}

std::shared_ptr<Work> UcxCommunicator::recv(at::Tensor t, int peer, int tag) {
  return pointToPoint(/*sending=*/false, std::move(t), peer, tag);
}

// Point-to-point messages use their own sequence value (they are not collective, so the group's
// counter would drift between ranks) and the caller's tag as the part.
std::shared_ptr<Work> UcxCommunicator::pointToPoint(bool sending, at::Tensor t, int peer, int tag) {
  Status valid = checkTensor(t, "the");
  if (valid.isOk() && (peer < 0 || peer >= size() || peer == rank_))
    valid = invalidArgument("peer {} is not another rank of {} ({} ranks)", peer, name_, size());
  if (valid.isOk() && (tag < 0 || tag > 0xFFF)) valid = invalidArgument("tag {} is outside 0..4095", tag);
  auto work = std::make_shared<Work>(fmt::format("{} rank {} (tag {}) on {}, {}", sending ? "send to" : "recv from",
                                                 peer, tag, name_, describe(t)));
  if (!valid.isOk()) {
    work->complete(valid.withContext(work->description()));
    return work;
  }
  transport_->enqueue(work, sending ? "send" : "recv", t.nbytes(), 2, [this, sending, t, peer, tag]() -> Status {
    std::vector<UcxTransport::Request> requests;
    auto posted = sending ? transport_->postSend(ranks_[peer], tagFrom(rank_, kPointToPointSequence, tag), t.data_ptr(),
                                                 t.nbytes(), fmt::format("the send to rank {}", peer))
                          : transport_->postReceive(ranks_[peer], tagFrom(peer, kPointToPointSequence, tag),
                                                    t.data_ptr(), t.nbytes(), fmt::format("a message from rank {}", peer));
    if (!posted.isOk()) return posted.status();
    requests.push_back(std::move(posted).value());
    return transport_->waitAll(requests);
  });
  return work;
}

// Dissemination: in round k every rank signals rank + 2^k and waits for rank - 2^k.
std::shared_ptr<Work> UcxCommunicator::barrier() {
  return submit("barrier", "0 B", 0, Status::ok(), [this](uint32_t seq) -> Status {
    const int n = size();
    uint32_t round = 0;
    for (int k = 1; k < n; k <<= 1, ++round) {
      std::vector<UcxTransport::Request> requests;
      int to = (rank_ + k) % n, from = (rank_ - k + n) % n;
      ASSIGN_OR_RETURN(auto r, transport_->postReceive(ranks_[from], tagFrom(from, seq, round), nullptr, 0,
                                                       fmt::format("round {} of the barrier from rank {}", round, from)));
      requests.push_back(std::move(r));
      ASSIGN_OR_RETURN(auto s, transport_->postSend(ranks_[to], tagFrom(rank_, seq, round), nullptr, 0,
                                                    fmt::format("round {} of the barrier to rank {}", round, to)));
      requests.push_back(std::move(s));
      RETURN_IF_ERROR(transport_->waitAll(requests));
    }
    return Status::ok();
  });
}

// ---- groups -------------------------------------------------------------------------------

StatusOr<std::shared_ptr<Communicator>> UcxCommunicator::split(const std::vector<int>& groupRanks,
                                                               const std::string& name) {
  const uint32_t index = splits_.fetch_add(1);
  if (groupRanks.empty()) return invalidArgument("split of {}: no ranks", name_);
  for (size_t i = 0; i < groupRanks.size(); ++i) {
    if (groupRanks[i] < 0 || groupRanks[i] >= size() || (i > 0 && groupRanks[i] <= groupRanks[i - 1]))
      return invalidArgument("split of {}: ranks must be ascending ranks of {} (0 to {})", name_, name_, size() - 1);
  }
  if (!std::binary_search(groupRanks.begin(), groupRanks.end(), rank_)) return std::shared_ptr<Communicator>();
  std::vector<int> world;
  for (int r : groupRanks) world.push_back(ranks_[r]);
  // Group ids come from the store, so no two groups of the job share one: the group's first
  // rank takes the next id and publishes it under a key every member can compute.
  std::string key = fmt::format("ucx/group/{}/{}/{}", groupId_, index, world.front());
  Store* store = transport_->store();
  if (!store) return failedPrecondition("split of {}: a single-rank transport has no store", name_);
  if (world.front() == transport_->rank()) {
    ASSIGN_OR_RETURN(int64_t id, store->add("ucx/groups", 1));
    if (id >= 0xFFF) return Status(StatusCode::kResourceExhausted, "more than 4094 communicator groups in one job");
    RETURN_IF_ERROR(store->set(key, std::to_string(id)));
  }
  ASSIGN_OR_RETURN(auto ids, store->get({key}, transport_->rendezvousTimeout()));
  uint32_t id = static_cast<uint32_t>(std::stoul(ids[0]));
  return std::shared_ptr<Communicator>(new UcxCommunicator(transport_, std::move(world), id, name));
}

}  // namespace loom::backends
