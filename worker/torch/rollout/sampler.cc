#include "worker/torch/rollout/sampler.h"

#include <algorithm>
#include <mutex>
#include <tuple>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include "worker/torch/model/ops.h"

namespace loom::worker {

namespace {

// splitmix64: nearby seeds (a request's samples 0, 1, 2) give unrelated streams.
uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// A uniform number in [0, 1) from the generator, 53 random bits.
double uniform(at::Generator& generator) {
  auto* impl = at::check_generator<at::CPUGeneratorImpl>(generator);
  std::lock_guard<std::mutex> lock(generator.mutex());
  return static_cast<double>(impl->random64() >> 11) * (1.0 / 9007199254740992.0);
}

// Indices [D, 1] into the last dimension of each row's cumulative weights, drawn by inverse CDF.
at::Tensor drawFromCdf(const at::Tensor& weights, const at::Tensor& uniforms) {
  const at::Tensor cdf = weights.cumsum(-1);
  const at::Tensor target = uniforms.unsqueeze(1) * cdf.narrow(1, cdf.size(1) - 1, 1);
  return at::searchsorted(cdf, target, /*out_int32=*/false, /*right=*/true).clamp_max(cdf.size(1) - 1);
}

}  // namespace

at::Generator sampleGenerator(uint64_t seed, int64_t sample) {
  return at::make_generator<at::CPUGeneratorImpl>(mix(mix(seed) + static_cast<uint64_t>(sample)));
}

LaunchedDraws launchDraws(const at::Tensor& logits, const std::vector<Draw>& draws) {
  const auto count = static_cast<int64_t>(draws.size());
  LaunchedDraws launched;
  if (count == 0) return launched;
  const int64_t vocab = logits.size(1);
  std::vector<int64_t> rows, sampled;
  std::vector<float> temperature, topK, topP, minP, uniforms;
  bool filters = false;
  int64_t maxTop = 0;
  for (int64_t i = 0; i < count; ++i) {
    const Draw& d = draws[i];
    const planner::SamplingParams& p = *d.params;
    rows.push_back(d.row);
    launched.topCounts.push_back(std::min(p.logprobs, vocab));
    maxTop = std::max(maxTop, p.logprobs);
    if (p.greedy()) continue;
    sampled.push_back(i);
    temperature.push_back(static_cast<float>(p.temperature));
    const bool limitsK = p.topK > 0 && p.topK < vocab;
    topK.push_back(static_cast<float>(limitsK ? p.topK : vocab));
    topP.push_back(static_cast<float>(p.topP));
    minP.push_back(static_cast<float>(p.minP));
    uniforms.push_back(static_cast<float>(uniform(*d.generator)));
    filters = filters || limitsK || p.topP < 1 || p.minP > 0;
  }
  const at::Device device = logits.device();
  // Through pinned memory, without waiting: a blocking copy would wait for the step running.
  auto onDevice = [&](const auto& values) {
    const at::Tensor t = at::tensor(values);
    return device.is_cpu() ? t : t.pin_memory().to(device, /*non_blocking=*/true);
  };
  // A decode step draws once from each row, in order: no copy of the logits then. They stay in
  // the model's dtype where the result does not depend on it (argmax, the fused logprobs): each
  // pass over [D, V] in fp32 would read and write twice the bytes.
  bool everyRow = count == logits.size(0);
  for (int64_t i = 0; everyRow && i < count; ++i) everyRow = rows[i] == i;
  const at::Tensor raw = everyRow ? logits : logits.index_select(0, onDevice(rows));  // [D, V]
  // The chosen tokens and their logprobs from the raw logits (as vLLM returns them by default):
  // the greedy rows' picks with their logprobs in one pass, then the sampled rows' over them.
  const bool everyRowSamples = static_cast<int64_t>(sampled.size()) == count;
  at::Tensor tokens, chosen;
  if (!everyRowSamples) std::tie(tokens, chosen) = ops().greedyLogprobs(raw);
  if (!sampled.empty()) {
    const at::Tensor which = onDevice(sampled);
    // The sampled rows' logits (every row in order: no copy), for the draw and for their logprobs.
    const at::Tensor rowsDrawn = everyRowSamples ? raw : raw.index_select(0, which);
    const at::Tensor scaled = rowsDrawn.to(at::kFloat) / onDevice(temperature).unsqueeze(1);
    const at::Tensor u = onDevice(uniforms);
    // The draw is by inverse CDF in vocabulary order whether or not a row filters, so that a
    // row's token never depends on whether another row of the batch made the step sort.
    const at::Tensor probs = at::softmax(scaled, -1);
    at::Tensor weights = probs;
    if (filters) {
      const at::Tensor order = std::get<1>(scaled.sort(-1, /*descending=*/true));
      const at::Tensor sorted = probs.gather(1, order);
      const at::Tensor rank = at::arange(vocab, order.options()).unsqueeze(0);
      at::Tensor keep = (sorted >= onDevice(minP).unsqueeze(1) * sorted.narrow(1, 0, 1))
                            .logical_and(rank < onDevice(topK).unsqueeze(1));
      at::Tensor kept = sorted * keep;
      kept = kept / kept.sum(-1, /*keepdim=*/true);
      // The smallest prefix whose mass reaches top_p: a token stays while the mass before it is short.
      keep = keep.logical_and((kept.cumsum(-1) - kept) < onDevice(topP).unsqueeze(1));
      weights = probs * at::zeros_like(keep).scatter(1, order, keep);
    }
    const at::Tensor picked = drawFromCdf(weights, u).squeeze(1);
    const at::Tensor pickedLogprobs = ops().logprobs(rowsDrawn, picked);
    if (everyRowSamples) {
      tokens = picked, chosen = pickedLogprobs;
    } else {
      tokens.index_put_({which}, picked);
      chosen.index_put_({which}, pickedLogprobs);
    }
  }
  launched.tokens = tokens;
  at::Tensor topValues, topIds;
  if (maxTop > 0) std::tie(topValues, topIds) = at::log_softmax(raw, -1, at::kFloat).topk(std::min(maxTop, vocab), -1);
  if (device.is_cpu()) {
    launched.hostTokens = tokens, launched.hostLogprobs = chosen, launched.hostTopIds = topIds;
    launched.hostTopValues = topValues;
    return launched;
  }
  // Copies into pinned memory that do not wait, and an event that says when they are done.
  auto toHost = [](const at::Tensor& t) {
    if (!t.defined()) return t;
    at::Tensor host = at::empty(t.sizes(), t.options().device(at::kCPU).pinned_memory(true));
    return host.copy_(t, /*non_blocking=*/true);
  };
  launched.hostTokens = toHost(tokens), launched.hostLogprobs = toHost(chosen);
  launched.hostTopIds = toHost(topIds), launched.hostTopValues = toHost(topValues);
  launched.copied = std::make_shared<c10::Event>(device.type());
  launched.copied->record(c10::impl::VirtualGuardImpl(device.type()).getStream(device));
  return launched;
}

std::vector<DrawnToken> collectDraws(const LaunchedDraws& launched) {
  if (launched.copied) launched.copied->synchronize();
  const auto count = static_cast<int64_t>(launched.topCounts.size());
  const int64_t width = launched.hostTopIds.defined() ? launched.hostTopIds.size(1) : 0;
  std::vector<DrawnToken> out(count);
  for (int64_t i = 0; i < count; ++i) {
    out[i].token = launched.hostTokens.data_ptr<int64_t>()[i];
    out[i].logprob = launched.hostLogprobs.data_ptr<float>()[i];
    for (int64_t k = 0; k < launched.topCounts[i]; ++k)
      out[i].top.emplace_back(launched.hostTopIds.data_ptr<int64_t>()[i * width + k],
                              launched.hostTopValues.data_ptr<float>()[i * width + k]);
  }
  return out;
}

std::vector<DrawnToken> drawTokens(const at::Tensor& logits, const std::vector<Draw>& draws) {
  return collectDraws(launchDraws(logits, draws));
}

}  // namespace loom::worker
