#include "worker/torch/rollout/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include <ATen/ATen.h>

#include "tests/catch.h"

using namespace loom;
using namespace loom::worker;

namespace {

const std::vector<double> kLogits{2.0, 1.5, 1.0, 0.5, 0.0, -0.5, -1.0, -3.0};

// The distribution the rules define, computed here from their definitions in doubles: softmax at
// the temperature; keep tokens of at least min_p x the top probability, then the top_k, then the
// smallest prefix of the rest (renormalised) whose mass reaches top_p; renormalise.
std::vector<double> expected(const planner::SamplingParams& p) {
  const size_t v = kLogits.size();
  std::vector<double> probs(v);
  double sum = 0;
  for (size_t i = 0; i < v; ++i) sum += probs[i] = std::exp(kLogits[i] / p.temperature);
  for (double& x : probs) x /= sum;
  std::vector<size_t> order(v);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return probs[a] > probs[b]; });
  std::vector<bool> keep(v, false);
  std::vector<size_t> kept;
  for (size_t r = 0; r < v; ++r) {
    const size_t i = order[r];
    if (probs[i] < p.minP * probs[order[0]]) continue;
    if (p.topK > 0 && static_cast<int64_t>(r) >= p.topK) continue;
    kept.push_back(i);
  }
  double keptMass = 0;
  for (size_t i : kept) keptMass += probs[i];
  double before = 0;
  for (size_t i : kept) {
    if (before / keptMass >= p.topP) break;
    keep[i] = true;
    before += probs[i];
  }
  double total = 0;
  for (size_t i = 0; i < v; ++i) total += keep[i] ? probs[i] : 0;
  std::vector<double> out(v);
  for (size_t i = 0; i < v; ++i) out[i] = keep[i] ? probs[i] / total : 0;
  return out;
}

// Counts of `draws` tokens drawn under `p` from rows of kLogits, each draw with its own generator.
std::vector<int64_t> drawCounts(const planner::SamplingParams& p, int64_t draws, uint64_t seed) {
  const at::Tensor row = at::tensor(std::vector<float>(kLogits.begin(), kLogits.end()));
  const at::Tensor logits = row.unsqueeze(0).expand({draws, -1}).contiguous();
  std::vector<at::Generator> generators;
  for (int64_t i = 0; i < draws; ++i) generators.push_back(sampleGenerator(seed, i));
  std::vector<Draw> batch;
  for (int64_t i = 0; i < draws; ++i) batch.push_back({.row = i, .params = &p, .generator = &generators[i]});
  std::vector<int64_t> counts(kLogits.size(), 0);
  for (const DrawnToken& t : drawTokens(logits, batch)) ++counts[t.token];
  return counts;
}

// Pearson's chi-square of the counts against the distribution, over the tokens it allows; and
// whether any disallowed token was drawn.
double chiSquare(const std::vector<int64_t>& counts, const std::vector<double>& probs, int64_t draws, int* dof,
                 bool* disallowed) {
  double chi = 0;
  *dof = -1;
  *disallowed = false;
  for (size_t i = 0; i < probs.size(); ++i) {
    if (probs[i] == 0) {
      *disallowed = *disallowed || counts[i] > 0;
      continue;
    }
    const double e = probs[i] * static_cast<double>(draws);
    chi += (counts[i] - e) * (counts[i] - e) / e;
    ++*dof;
  }
  return chi;
}

}  // namespace

TEST_CASE("sampler: the drawn distribution matches temperature, min-p, top-k and top-p (chi-square)", "[rollout]") {
  // Critical values of chi-square at p = 0.001 by degrees of freedom: a correct sampler fails one
  // case in a thousand, and the fixed seed makes the outcome the same every run.
  const double kCritical[] = {0, 10.83, 13.82, 16.27, 18.47, 20.52, 22.46, 24.32, 26.12};
  const int64_t draws = 40000;
  struct Case {
    const char* name;
    planner::SamplingParams params;
  };
  const Case cases[] = {
      {"temperature 1", {.temperature = 1.0}},
      {"temperature 0.6", {.temperature = 0.6}},
      {"top_k 3", {.temperature = 1.0, .topK = 3}},
      {"top_p 0.8", {.temperature = 1.0, .topP = 0.8}},
      {"min_p 0.2 at temperature 1.4", {.temperature = 1.4, .minP = 0.2}},
      {"min_p 0.05, top_k 5, top_p 0.9 at temperature 0.8", {.temperature = 0.8, .topK = 5, .topP = 0.9, .minP = 0.05}},
  };
  uint64_t seed = 17;
  for (const Case& c : cases) {
    INFO(c.name);
    const std::vector<double> probs = expected(c.params);
    const std::vector<int64_t> counts = drawCounts(c.params, draws, seed++);
    int dof = 0;
    bool disallowed = false;
    const double chi = chiSquare(counts, probs, draws, &dof, &disallowed);
    INFO("chi-square " << chi << " with " << dof << " degrees of freedom");
    CHECK(!disallowed);
    REQUIRE(dof >= 1);
    CHECK(chi < kCritical[dof]);
  }
}

TEST_CASE("sampler: greedy, logprobs from the raw logits, top logprobs, and draws that ignore the batch", "[rollout]") {
  const at::Tensor logits = at::randn({4, 50}, at::TensorOptions().dtype(at::kFloat));
  planner::SamplingParams greedy{.temperature = 1e-6, .logprobs = 3};
  planner::SamplingParams hot{.temperature = 2.0, .topK = 10, .topP = 0.95};
  at::Generator g0 = sampleGenerator(5, 0), g1 = sampleGenerator(5, 1);
  std::vector<DrawnToken> out = drawTokens(logits, {{.row = 2, .params = &greedy, .generator = nullptr},
                                                    {.row = 1, .params = &hot, .generator = &g0}});
  const at::Tensor logprobs = at::log_softmax(logits, -1);
  CHECK(out[0].token == logits[2].argmax().item<int64_t>());
  CHECK(std::abs(out[0].logprob - logprobs[2][out[0].token].item<float>()) < 1e-5);
  CHECK(std::abs(out[1].logprob - logprobs[1][out[1].token].item<float>()) < 1e-5);
  REQUIRE(out[0].top.size() == 3);
  CHECK(out[0].top[0].first == out[0].token);
  CHECK(out[0].top[0].second >= out[0].top[1].second);
  CHECK(out[0].top[1].second >= out[0].top[2].second);
  CHECK(out[1].top.empty());

  // A sample's token depends on its generator and its row only: alone, or beside other rows with
  // other rules, it draws the same.
  planner::SamplingParams plain{.temperature = 0.9};
  for (int trial = 0; trial < 20; ++trial) {
    at::Generator a = sampleGenerator(100 + trial, 0), b = sampleGenerator(100 + trial, 0);
    at::Generator other = sampleGenerator(7, trial);
    const int64_t alone = drawTokens(logits, {{.row = 3, .params = &plain, .generator = &a}})[0].token;
    const auto together = drawTokens(logits, {{.row = 0, .params = &hot, .generator = &other},
                                              {.row = 3, .params = &plain, .generator = &b}});
    CHECK(together[1].token == alone);
  }
  (void)g1;
}
