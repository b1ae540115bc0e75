#include "worker/torch/parallel/expert_parallel.h"

#include <numeric>

#include <ATen/ATen.h>
#include <ATen/record_function.h>
#include <torch/csrc/autograd/custom_function.h>

#include "worker/torch/parallel/autograd_communicator.h"
#include "worker/torch/parallel/throw_if_error.h"

namespace loom::worker {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

// rows [R, H], sendRows[j] of them (in order) for rank j -> recvRows[i] rows from each rank i.
// Host buffers come from the communicator, so that ranks on one host exchange in shared memory.
at::Tensor exchangeRows(const at::Tensor& rows, const std::vector<int64_t>& sendRows,
                        const std::vector<int64_t>& recvRows, backends::Communicator& ep) {
  RECORD_FUNCTION("loom::expert_parallel_all_to_all", std::vector<c10::IValue>());
  const int64_t width = rows.size(1);
  const int64_t received = std::accumulate(recvRows.begin(), recvRows.end(), int64_t{0});
  auto buffer = [&](int64_t n) {
    return rows.is_cpu() ? ep.allocate({n, width}, rows.scalar_type()) : at::empty({n, width}, rows.options());
  };
  at::Tensor input = buffer(rows.size(0)), output = buffer(received);
  input.copy_(rows);
  std::vector<int64_t> sendElements, recvElements;
  for (int64_t n : sendRows) sendElements.push_back(n * width);
  for (int64_t n : recvRows) recvElements.push_back(n * width);
  throwIfError(ep.allToAllV(output, input, recvElements, sendElements)->wait().withContext("expert-parallel all-to-all-v"));
  return output;
}

struct ExchangeRows : public torch::autograd::Function<ExchangeRows> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& rows, std::vector<int64_t> sendRows,
                            std::vector<int64_t> recvRows, backends::Communicator* ep) {
    keepCommunicator(ctx, *ep);
    ctx->saved_data["send"] = sendRows;
    ctx->saved_data["recv"] = recvRows;
    return exchangeRows(rows, sendRows, recvRows, *ep);
  }
  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    const auto send = ctx->saved_data["send"].toIntVector(), recv = ctx->saved_data["recv"].toIntVector();
    return {exchangeRows(grads[0].contiguous(), recv, send, communicatorOf(ctx)), at::Tensor(), at::Tensor(),
            at::Tensor()};
  }
};

}  // namespace

ExpertParallel::ExpertParallel(std::shared_ptr<backends::Communicator> group, int64_t numExperts)
    : group_(std::move(group)), numExperts_(numExperts), localExperts_(numExperts / group_->size()) {}

at::Tensor ExpertParallel::run(const at::Tensor& rows, const std::vector<int64_t>& counts, const MoeWeights& w,
                               LinearFn linear, const planner::ExpertMlpConfig& mlp, std::vector<int64_t>* arrived) {
  backends::Communicator& ep = *group_;
  const int n = ep.size();
  const int64_t local = localExperts_;
  std::vector<int64_t> exchanged;
  if (!arrived || arrived->empty()) {
    // How many rows each rank sends each of this rank's experts: one all-to-all of the counts.
    at::Tensor sendCounts = rows.is_cpu() ? ep.allocate({numExperts_}, at::kLong)
                                          : at::empty({numExperts_}, rows.options().dtype(at::kLong));
    at::Tensor recvCounts = rows.is_cpu() ? ep.allocate({numExperts_}, at::kLong) : at::empty_like(sendCounts);
    sendCounts.copy_(at::tensor(counts, at::kLong));
    throwIfError(ep.allToAll(recvCounts, sendCounts)->wait().withContext("expert-parallel count all-to-all"));
    const at::Tensor fromRanks = recvCounts.cpu();
    exchanged.assign(fromRanks.data_ptr<int64_t>(), fromRanks.data_ptr<int64_t>() + fromRanks.numel());
    if (arrived) *arrived = exchanged;
  }
  // [source rank, local expert]
  const int64_t* from = arrived && !arrived->empty() ? arrived->data() : exchanged.data();
  std::vector<int64_t> sendRows(n, 0), recvRows(n, 0);
  for (int r = 0; r < n; ++r) {
    for (int64_t e = 0; e < local; ++e) {
      sendRows[r] += counts[r * local + e];
      recvRows[r] += from[r * local + e];
    }
  }
  const at::Tensor received = ExchangeRows::apply(rows, sendRows, recvRows, &ep);  // by source, then expert
  // Regrouped by local expert (then source), the order the grouped MLPs take.
  std::vector<int64_t> starts(static_cast<size_t>(n * local));
  int64_t offset = 0;
  for (int r = 0; r < n * static_cast<int>(local); ++r) {
    starts[r] = offset;
    offset += from[r];
  }
  std::vector<int64_t> byExpert, perLocal(local, 0);
  byExpert.reserve(static_cast<size_t>(offset));
  for (int64_t e = 0; e < local; ++e) {
    for (int r = 0; r < n; ++r) {
      const int64_t block = r * local + e;
      for (int64_t i = 0; i < from[block]; ++i) byExpert.push_back(starts[block] + i);
      perLocal[e] += from[block];
    }
  }
  const at::Tensor gatherIndex = at::tensor(byExpert, at::kLong).to(rows.device());
  const at::Tensor outputs = groupedExpertMlp(received.index_select(0, gatherIndex), perLocal, w, linear, mlp);
  // Back in arrival order, then home.
  const at::Tensor inArrivalOrder = at::zeros_like(outputs).index_copy(0, gatherIndex, outputs);
  return ExchangeRows::apply(inArrivalOrder, recvRows, sendRows, &ep);
}

}  // namespace loom::worker
