#include "worker/torch/jobs/rollout_job.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>
#include <optional>
#include <thread>

#include <fmt/format.h>

#include "common/files.h"
#include "common/human_bytes.h"
#include "worker/checkpoint/manifest.h"
#include "worker/checkpoint/safetensors_reader.h"
#include "worker/data/hf_tokenizer.h"
#include "worker/rollout/generation_config.h"
#include "worker/rollout/prompts_file.h"
#include "worker/torch/checkpoint/safetensors.h"
#include "worker/torch/jobs/step_profiler.h"
#include "worker/torch/model/model_setup.h"
#include "worker/torch/rollout/result_collector.h"
#include "worker/torch/rollout/rollout_engine.h"
#include "worker/torch/rollout/rollout_group.h"
#include "worker/torch/rollout/serve_loop.h"

namespace loom::worker {

namespace {

using Clock = std::chrono::steady_clock;

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// The KV cache's bytes: rollout.kv_cache_memory_gb, or on a GPU gpu_memory_utilization of it less
// what is held already (the model) and what a step of max_num_batched_tokens takes.
int64_t kvCacheBudget(const planner::JobSpec& spec, const DecoderModel& model, const at::Device& device) {
  const planner::RolloutSpec& r = spec.rollout;
  if (r.kvCacheMemoryGb > 0) return static_cast<int64_t>(r.kvCacheMemoryGb * double(int64_t(1) << 30));
  if (!device.is_cuda()) return int64_t(1) << 30;
  const auto [free, total] = deviceMemoryInfo(device);
  const planner::ModelConfig& c = model.config();
  // A step's activations: a few hidden-sized and MLP-sized rows per token, and fp32 logits per sequence.
  const int64_t step = r.maxNumBatchedTokens * (8 * c.hiddenSize + 3 * c.intermediateSize) * 4 +
                       r.maxNumSeqs * c.vocabSize * 4 * 4;
  const int64_t used = total - free;
  return static_cast<int64_t>(r.gpuMemoryUtilization * static_cast<double>(total)) - used - step;
}

// The weights an UpdateWeights names: a directory of safetensors (a Hugging Face model
// directory or a checkpoint's tag directory, whose manifest must hold), or a Loom checkpoint
// directory whose `latest` names the tag. Returns the directory the tensors were read from.
StatusOr<std::string> reloadWeights(DecoderModel& model, const std::string& dir) {
  auto where = [&](const Status& s) { return s.withContext("checkpoint_dir"); };
  if (!files::exists(dir)) return where(notFound("{}: no such directory", dir));
  std::string tagDir = dir;
  if (files::exists(dir + "/latest")) {
    auto tag = checkpoint::readLatestTag(dir);
    if (!tag.isOk()) return where(tag.status());
    tagDir = dir + "/" + *tag;
  }
  if (files::exists(tagDir + "/manifest.json")) {
    // The weights' files only: a train job's tag also holds the optimizer state, several times their size.
    auto model = checkpoint::modelFiles(tagDir);
    if (!model.isOk()) return where(model.status());
    std::vector<std::string> read;
    for (const std::string& file : *model) read.push_back(std::filesystem::path(file).filename().string());
    if (files::exists(tagDir + "/model.safetensors.index.json")) read.push_back("model.safetensors.index.json");
    if (Status whole = checkpoint::checkManifest(tagDir, read); !whole.isOk()) return where(whole);
  }
  auto weights = loadSafetensors(tagDir);
  if (!weights.isOk()) return where(weights.status());
  if (Status loaded = model.loadWeights(*weights, tagDir); !loaded.isOk()) return where(loaded);
  return tagDir;
}

class RolloutRunner final : public JobRunner {
 public:
  explicit RolloutRunner(RankSetup& rank) : rank_(rank) {}

  Status run() override {
    const planner::JobSpec& spec = rank_.spec;
    const planner::RolloutSpec& r = spec.rollout;
    // The job's ranks are one tensor-parallel group (checkRunnable): rank 0 schedules, all compute.
    std::optional<RolloutGroup> group;
    if (rank_.mesh.tensor->size() > 1) group.emplace(*rank_.mesh.tensor, rank_.device);
    ASSIGN_OR_RETURN(BuiltModel built, buildModel(spec, rank_.local, rank_.device, rank_.mesh));
    DecoderModel& model = *built.model;
    model.fuseProjections();
    releaseCachedMemory(rank_.device);  // the unfused weights' memory, before the KV cache is sized
    const planner::ModelConfig& config = model.config();
    const int64_t maxModelLen = r.maxModelLen > 0 ? r.maxModelLen : config.maxPositionEmbeddings;
    if (maxModelLen > config.maxPositionEmbeddings)
      return invalidArgument("rollout.max_model_len: {} is beyond the model's max_position_embeddings {}", maxModelLen,
                             config.maxPositionEmbeddings);

    const int64_t budget = kvCacheBudget(spec, model, rank_.device);
    const int64_t blockBytes = model.kvCacheBytesPerBlock(r.blockSize);
    int64_t numBlocks = std::max<int64_t>(0, budget / blockBytes);
    if (group) numBlocks = group->minimum(numBlocks);  // every rank holds the same blocks, its KV heads
    if (numBlocks < 1)
      return Status(StatusCode::kResourceExhausted,
                    fmt::format("rollout.kv_cache_memory_gb: {} leaves no room for one KV block of {} tokens ({})",
                                budget > 0 ? humanBytes(budget) : "the device's memory less the model's",
                                r.blockSize, humanBytes(blockBytes)));
    rollout::SchedulerLimits limits{.blockSize = static_cast<int32_t>(r.blockSize),
                                    .numBlocks = static_cast<int32_t>(std::min<int64_t>(numBlocks, INT32_MAX)),
                                    .maxNumSeqs = r.maxNumSeqs,
                                    .maxNumBatchedTokens = r.maxNumBatchedTokens,
                                    .maxModelLen = maxModelLen};
    RETURN_IF_ERROR(limits.validate());
    // Every rank reads these, so that a bad one fails them alike (no rank waits for a step).
    std::optional<data::HfTokenizer> tokenizer;
    if (!r.tokenizer.empty()) {
      auto loaded = data::HfTokenizer::load(r.tokenizer);
      if (!loaded.isOk()) return loaded.status().withContext("rollout.tokenizer");
      tokenizer.emplace(std::move(*loaded));
    }
    ASSIGN_OR_RETURN(std::vector<int64_t> eos, rollout::readEosTokenIds(spec.model.config));
    if (eos.empty() && tokenizer) eos.assign(tokenizer->eosTokenIds().begin(), tokenizer->eosTokenIds().end());
    PagedKvCache cache = model.createKvCache(limits.numBlocks + 1, limits.blockSize, maxModelLen);
    auto reload = [&](const std::string& dir) {
      if (group) group->sendReload(dir);
      return reloadWeights(model, dir);
    };
    if (group && !group->leader())
      return group->follow(model, cache, config.slidingWindow,
                           [&](const std::string& dir) { return reloadWeights(model, dir).status(); });

    // The cache has one block more than the scheduler hands out: the scratch block of padded
    // CUDA-graph rows.
    RolloutEngine engine(model, std::move(cache),
                         EngineOptions{.limits = limits, .eosTokenIds = eos, .cudaGraphs = r.cudaGraphs,
                                       .asyncScheduling = r.asyncScheduling,
                                       .group = group ? &*group : nullptr});
    std::printf("rollout: KV cache %d blocks of %d tokens (%s per rank), max_num_seqs %lld, max_num_batched_tokens "
                "%lld, max_model_len %lld, tensor parallel %d, CUDA graphs %s, asynchronous scheduling %s\n",
                limits.numBlocks, limits.blockSize, humanBytes(limits.numBlocks * blockBytes).c_str(),
                static_cast<long long>(limits.maxNumSeqs), static_cast<long long>(limits.maxNumBatchedTokens),
                static_cast<long long>(maxModelLen), group ? group->size() : 1, engine.cudaGraphs() ? "on" : "off",
                engine.asyncScheduling() ? "on" : "off");
    std::fflush(stdout);
    const Clock::time_point warming = Clock::now();
    if (const std::optional<int64_t> graphs = engine.warmUp()) {
      std::printf("rollout: warmed up in %.2f s (a step of %lld tokens, %lld decode graphs)\n",
                  seconds(Clock::now() - warming), static_cast<long long>(limits.maxNumBatchedTokens),
                  static_cast<long long>(*graphs));
      std::fflush(stdout);
    }
    const data::HfTokenizer* text = tokenizer ? &*tokenizer : nullptr;
    if (r.serve) return serve(engine, reload, text);
    // The other ranks follow until the end, also when this one stops at an error.
    const Status status = runBatch(engine, text);
    if (group) group->sendEnd();
    return status;
  }

 private:
  // serve: true. The engine loop runs until the job is cancelled; rank 0's RolloutService takes
  // the requests (the planner routes clients to it).
  Status serve(RolloutEngine& engine, const WeightsLoader& reload, const data::HfTokenizer* tokenizer) {
    const planner::RolloutSpec& r = rank_.spec.rollout;
    if (!rank_.serveRollout) return internalError("rollout.serve: this worker has no RPC server to serve with");
    rollout::RolloutInbox inbox;
    ServeLoop loop(engine, inbox,
                   ServeOptions{.tokenizer = tokenizer,
                                .seed = static_cast<uint64_t>(r.seed),
                                .weightsSource = rank_.spec.model.weights,
                                .loadWeights = reload,
                                .metrics = rank_.progress});
    ASSIGN_OR_RETURN(std::shared_ptr<void> server, rank_.serveRollout(inbox, r.sampling));
    loop.run();
  }

  Status runBatch(RolloutEngine& engine, const data::HfTokenizer* tokenizer) {
    const planner::JobSpec& spec = rank_.spec;
    const planner::RolloutSpec& r = spec.rollout;
    ASSIGN_OR_RETURN(std::vector<rollout::PromptLine> prompts, rollout::readPromptsFile(r.prompts, r.sampling));
    std::printf("rollout: %lld prompts\n", static_cast<long long>(prompts.size()));
    std::fflush(stdout);

    // Requests are numbered in file order and arrive at their arrival_s (all at the start by default).
    for (const rollout::PromptLine& p : prompts) {
      if (Status needs = rollout::checkTokenizerNeeds(p.isText, p.sampling, tokenizer); !needs.isOk())
        return needs.withContext(fmt::format("rollout.prompts: line {}", p.line));
    }
    std::vector<size_t> arrivals(prompts.size());
    for (size_t i = 0; i < arrivals.size(); ++i) arrivals[i] = i;
    std::stable_sort(arrivals.begin(), arrivals.end(),
                     [&](size_t a, size_t b) { return prompts[a].arrivalS < prompts[b].arrivalS; });
    size_t arrived = 0;
    const Clock::time_point start = Clock::now();
    ResultCollector collector(prompts, tokenizer);
    auto admitArrivals = [&](Clock::time_point now) -> Status {
      for (; arrived < arrivals.size() && prompts[arrivals[arrived]].arrivalS <= seconds(now - start); ++arrived) {
        const size_t i = arrivals[arrived];
        const rollout::PromptLine& p = prompts[i];
        auto where = [&](const Status& s) { return s.withContext(fmt::format("rollout.prompts: line {}", p.line)); };
        auto ids = rollout::promptTokenIds(p.isText, p.text, p.tokenIds, p.sampling, tokenizer);
        if (!ids.isOk()) return where(ids.status());
        std::vector<int64_t> promptIds = *ids;
        auto id = engine.addRequest(std::move(*ids), p.sampling, r.seed + i);
        if (!id.isOk()) return where(id.status());
        collector.addRequest(*id, i, std::move(promptIds), now);
      }
      return Status::ok();
    };
    RETURN_IF_ERROR(admitArrivals(start));

    int64_t promptTokens = 0, steps = 0;
    Clock::time_point lastReport = start;
    while (!engine.idle() || arrived < arrivals.size()) {
      RETURN_IF_ERROR(admitArrivals(Clock::now()));
      if (engine.idle()) {
        // Nothing to compute before the next arrival.
        const double wait = prompts[arrivals[arrived]].arrivalS - seconds(Clock::now() - start);
        if (wait > 0) std::this_thread::sleep_for(std::chrono::duration<double>(wait));
        continue;
      }
      std::optional<StepProfiler> profiler;
      if (steps + 1 == r.profileStep) {
        synchronize(rank_.device);
        profiler.emplace(rank_.device);
      }
      const Clock::time_point stepStart = Clock::now();
      StepEvents events = engine.step();
      if (profiler) {
        synchronize(rank_.device);
        const double ms = seconds(Clock::now() - stepStart) * 1e3;
        std::printf("profile of step %lld (rollout.profile_step; %lld sequences running):\n%s",
                    static_cast<long long>(steps + 1), static_cast<long long>(engine.scheduler().numRunning()),
                    profiler->report(ms).c_str());
        std::fflush(stdout);
      }
      if (events.computedTokens == 0)
        return internalError("rollout: a step scheduled nothing with {} sequences waiting",
                             engine.scheduler().numWaiting());
      const Clock::time_point now = Clock::now();
      ++steps;
      promptTokens += events.promptTokens;
      std::vector<rollout::SequenceId> stopped;
      for (const TokenEvent& e : events.tokens)
        if (collector.onToken(e, now)) stopped.push_back(e.sequence);
      for (const rollout::FinishedSequence& f : events.finished) collector.onFinished(f);
      // A stop string ends a sample its stop rule has not ended already this step.
      for (rollout::SequenceId id : stopped)
        if (engine.scheduler().sequence(id)) collector.onFinished(engine.finish(id, rollout::FinishReason::kStop));
      if (seconds(now - lastReport) >= 1.0 || (engine.idle() && arrived == arrivals.size())) {
        lastReport = now;
        const rollout::Scheduler& s = engine.scheduler();
        const double elapsed = std::max(1e-9, seconds(now - start));
        rank_.progress(steps, {{"rollout_requests_running", double(s.numRunning())},
                               {"rollout_requests_waiting", double(s.numWaiting())},
                               {"rollout_kv_blocks_used", double(s.numBlocksUsed())},
                               {"rollout_preemptions", double(s.numPreemptions())},
                               {"rollout_prompt_tokens_per_s", double(promptTokens) / elapsed},
                               {"rollout_output_tokens_per_s", double(collector.outputTokens()) / elapsed},
                               {"rollout_ttft_p50_s", collector.ttft(0.5)},
                               {"rollout_itl_p50_s", collector.itl(0.5)}});
      }
    }
    const double elapsed = std::max(1e-9, seconds(Clock::now() - start));
    const size_t samples = collector.numSamples();
    const int64_t outputTokens = collector.outputTokens();
    RETURN_IF_ERROR(rollout::writeResultsFile(r.output, collector.takeResults()));
    std::printf("rollout: %lld samples, %lld output tokens in %.3f s: %.1f output tokens/s, %.1f prompt tokens/s; "
                "%lld steps, %lld preemptions\n",
                static_cast<long long>(samples), static_cast<long long>(outputTokens), elapsed,
                double(outputTokens) / elapsed, double(promptTokens) / elapsed, static_cast<long long>(steps),
                static_cast<long long>(engine.scheduler().numPreemptions()));
    std::printf("rollout: time to first token p50 %.4f s p90 %.4f s p99 %.4f s; inter-token latency p50 %.4f s "
                "p90 %.4f s p99 %.4f s\n",
                collector.ttft(0.5), collector.ttft(0.9), collector.ttft(0.99), collector.itl(0.5), collector.itl(0.9),
                collector.itl(0.99));
    std::printf("rollout: results written to %s\n", r.output.c_str());
    std::fflush(stdout);
    return Status::ok();
  }

 private:
  RankSetup& rank_;
};

}  // namespace

StatusOr<std::unique_ptr<JobRunner>> makeRolloutRunner(RankSetup& rank) {
  return std::unique_ptr<JobRunner>(std::make_unique<RolloutRunner>(rank));
}

}  // namespace loom::worker
