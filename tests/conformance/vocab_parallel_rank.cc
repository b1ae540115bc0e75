// One rank of the vocabulary-parallel loss check (tests/oracles/vocab_parallel_test.py). Started N
// times with RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT; reads LOOM_VP_INPUT (safetensors:
// whole fp32 "student" and "teacher" logits [N, V], "labels" [N] int64 with -100s, upstream
// gradients "grad" [N]), takes its columns [rank * V / N, (rank + 1) * V / N), and writes to
// LOOM_VP_OUTPUT.rank<r>.safetensors each op's forward and the gradients of its shard:
//   logprobs, entropy, kl (forward KL(teacher || student)), kl_reverse: value and
//   <op>.grad (student), kl*.teacher_grad; ce (mean cross entropy) and ce.grad (of the mean);
//   ce_blocks / ce_blocks.grad: the same with LOOM_VP_BLOCK_ROWS rows per block.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>

#include "backends/rendezvous/tcp_store.h"
#include "backends/ucx/ucx_communicator.h"
#include "worker/torch/checkpoint/safetensors.h"
#include "worker/torch/parallel/vocab_parallel.h"

using namespace loom;
using namespace loom::worker;

namespace {

int env(const char* name) { return std::atoi(std::getenv(name)); }

int fail(const std::string& what) {
  std::printf("FAIL %s\n", what.c_str());
  return 1;
}

// Forward of `op` on fresh leaves, then backward with `grad`: the value and the leaves' gradients.
template <typename Op>
std::pair<at::Tensor, std::vector<at::Tensor>> run(Op&& op, std::vector<at::Tensor> inputs, const at::Tensor& grad) {
  for (auto& x : inputs) x = x.detach().clone().set_requires_grad(true);
  at::Tensor value = op(inputs);
  torch::autograd::backward({value}, {grad});
  std::vector<at::Tensor> grads;
  for (auto& x : inputs) grads.push_back(x.grad());
  return {value.detach(), grads};
}

}  // namespace

int main() {
  const int rank = env("RANK"), world = env("WORLD_SIZE");
  auto store = backends::TcpStore::connect({.host = std::getenv("MASTER_ADDR"), .port = env("MASTER_PORT"),
                                            .isServer = rank == 0, .connectTimeout = std::chrono::seconds(30)});
  if (!store.isOk()) return fail("store: " + store.status().toString());
  auto transport = backends::UcxTransport::create({.rank = rank, .worldSize = world, .store = store->get()});
  if (!transport.isOk()) return fail("transport: " + transport.status().toString());
  auto comm = backends::UcxCommunicator::world(*transport);
  auto input = loadSafetensors(std::getenv("LOOM_VP_INPUT"));
  if (!input.isOk()) return fail("input: " + input.status().toString());
  TensorMap& in = *input;
  const int64_t vocab = in["student"].size(1), columns = vocab / world, start = rank * columns;
  const at::Tensor student = in["student"].slice(1, start, start + columns).contiguous();
  const at::Tensor teacher = in["teacher"].slice(1, start, start + columns).contiguous();
  const at::Tensor labels = in["labels"], grad = in["grad"];
  const VocabShard shard{.tp = comm.get(), .vocabStart = start, .blockRows = 0};
  const VocabShard blocks{.tp = comm.get(), .vocabStart = start, .blockRows = env("LOOM_VP_BLOCK_ROWS")};

  TensorMap out;
  auto keep = [&](const std::string& name, const std::pair<at::Tensor, std::vector<at::Tensor>>& r) {
    out[name] = r.first;
    out[name + ".grad"] = r.second[0];
    if (r.second.size() > 1) out[name + ".teacher_grad"] = r.second[1];
  };
  keep("logprobs", run([&](auto& x) { return vocabParallelLogprobs(x[0], labels, shard); }, {student}, grad));
  keep("entropy", run([&](auto& x) { return vocabParallelEntropy(x[0], shard); }, {student}, grad));
  keep("kl", run([&](auto& x) { return vocabParallelKl(x[0], x[1], false, shard); }, {student, teacher}, grad));
  keep("kl_reverse", run([&](auto& x) { return vocabParallelKl(x[0], x[1], true, shard); }, {student, teacher}, grad));
  const at::Tensor one = at::ones({}, at::kFloat);
  keep("ce", run([&](auto& x) { return vocabParallelCrossEntropy(x[0], labels, shard); }, {student}, one));
  keep("ce_blocks", run([&](auto& x) { return vocabParallelCrossEntropy(x[0], labels, blocks); }, {student}, one));
  Status saved = saveSafetensorsFile(std::string(std::getenv("LOOM_VP_OUTPUT")) + ".rank" + std::to_string(rank) +
                                         ".safetensors",
                                     out);
  if (!saved.isOk()) return fail("output: " + saved.toString());
  return comm->barrier()->wait().isOk() ? 0 : fail("barrier");
}
