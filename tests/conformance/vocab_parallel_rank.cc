// One rank of the vocabulary-parallel loss check (tests/oracles/vocab_parallel_test.py). Started N
// times with RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT; reads LOOM_VP_INPUT (safetensors:
// whole fp32 "student" and "teacher" logits [N, V], "labels" [N] int64 with -100s, upstream
// gradients "grad" [N]), takes its columns [rank * V / N, (rank + 1) * V / N), and writes to
// LOOM_VP_OUTPUT.rank<r>.safetensors each op's forward and the gradients of its shard:
//   logprobs, entropy, kl (forward KL(teacher || student)), kl_reverse: value and
//   <op>.grad (student), kl*.teacher_grad; ce (mean cross entropy) and ce.grad (of the mean);
//   ce_blocks / ce_blocks.grad: the same with LOOM_VP_BLOCK_ROWS rows per block.
// And over a rollout batch in DeepSpeed's form ("rollout_input_ids" [B, S] right-padded,
// "rollout_attention_mask", "rollout_response_start" [B], logits "rollout_student" and
// "rollout_teacher" [B, S, V]), packed as the trainer packs rollout samples: the mean response-token
// cross entropy (response_ce) and generalized JSD losses (jsd_<case>), with the gradients of the
// student's shard of the first S - 1 positions, flattened [B * (S - 1), V / N].
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>

#include "backends/rendezvous/tcp_store.h"
#include "backends/ucx/ucx_communicator.h"
#include "worker/torch/checkpoint/safetensors.h"
#include "worker/torch/data/response_batch.h"
#include "worker/torch/jobs/response_losses.h"
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
    if (r.second.size() > 1 && r.second[1].defined()) out[name + ".teacher_grad"] = r.second[1];
  };
  keep("logprobs", run([&](auto& x) { return vocabParallelLogprobs(x[0], labels, shard); }, {student}, grad));
  keep("entropy", run([&](auto& x) { return vocabParallelEntropy(x[0], shard); }, {student}, grad));
  keep("kl", run([&](auto& x) { return vocabParallelKl(x[0], x[1], false, shard); }, {student, teacher}, grad));
  keep("kl_reverse", run([&](auto& x) { return vocabParallelKl(x[0], x[1], true, shard); }, {student, teacher}, grad));
  const at::Tensor one = at::ones({}, at::kFloat);
  keep("ce", run([&](auto& x) { return vocabParallelCrossEntropy(x[0], labels, shard); }, {student}, one));
  keep("ce_blocks", run([&](auto& x) { return vocabParallelCrossEntropy(x[0], labels, blocks); }, {student}, one));

  // The rollout batch as the trainer sees it: samples packed into inputs and response labels.
  const at::Tensor ids = in["rollout_input_ids"], mask = in["rollout_attention_mask"];
  const at::Tensor starts = in["rollout_response_start"];
  std::vector<rollout::ResponseSample> samples(ids.size(0));
  std::vector<const rollout::ResponseSample*> pointers;
  for (int64_t b = 0; b < ids.size(0); ++b) {
    const int64_t length = mask[b].sum().item<int64_t>(), start = starts[b].item<int64_t>();
    const int64_t* row = ids[b].data_ptr<int64_t>();
    samples[b].promptTokenIds.assign(row, row + start);
    samples[b].responseTokenIds.assign(row + start, row + length);
    pointers.push_back(&samples[b]);
  }
  const ResponseBatch batch = packResponses(pointers);
  const int64_t width = batch.labels.size(1);
  auto rows = [&](const char* name) {
    return in[name].slice(1, 0, width).slice(2, start, start + columns).reshape({-1, columns}).contiguous();
  };
  const at::Tensor responseLabels = batch.labels.reshape({-1});
  const at::Tensor count = (responseLabels != -100).sum().to(at::kFloat);
  keep("response_ce", run([&](auto& x) { return vocabParallelCrossEntropy(x[0], responseLabels, shard); },
                          {rows("rollout_student")}, one));
  struct JsdCase {
    const char* name;
    JsdOptions options;
    int64_t topK;
  };
  std::vector<JsdCase> cases{{"jsd_mixture", {.beta = 0.5, .temperature = 1.0}, 0},
                             {"jsd_forward_kl", {.beta = 0.0, .temperature = 2.0}, 0},
                             {"jsd_reverse_kl", {.beta = 1.0, .temperature = 1.0}, 0},
                             {"jsd_clipped", {.beta = 0.3, .temperature = 1.5, .pointwiseClip = 0.05}, 0}};
  if (world == 1) cases.push_back({"jsd_top_k", {.beta = 0.5, .temperature = 1.0}, 5});
  for (const JsdCase& c : cases)
    keep(c.name, run([&](auto& x) { return jsdLossSum(x[0], x[1], responseLabels, c.options, c.topK, shard) / count; },
                     {rows("rollout_student"), rows("rollout_teacher")}, one));

  Status saved = saveSafetensorsFile(std::string(std::getenv("LOOM_VP_OUTPUT")) + ".rank" + std::to_string(rank) +
                                         ".safetensors",
                                     out);
  if (!saved.isOk()) return fail("output: " + saved.toString());
  return comm->barrier()->wait().isOk() ? 0 : fail("barrier");
}
