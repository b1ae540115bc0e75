#include "worker/torch/jobs/train_job.h"

#include <chrono>
#include <cstdio>
#include <optional>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "common/human_bytes.h"
#include "common/process.h"
#include "worker/checkpoint/state_layout.h"
#include "worker/preemption.h"
#include "worker/torch/checkpoint/checkpoint.h"
#include "worker/torch/jobs/evaluation.h"
#include "worker/torch/jobs/response_training.h"
#include "worker/torch/model/kernels.h"
#include "worker/torch/model/model_setup.h"
#include "worker/torch/jobs/step_profiler.h"
#include "worker/torch/jobs/wall_clock.h"
#include "worker/torch/zero/zero_optimizer.h"
#include "worker/torch/data/token_samples.h"
#include "worker/torch/parallel/whole_weights.h"
#include "worker/optim/loss_scaler.h"
#include "worker/optim/lr_schedule.h"
#include "worker/data/sample_order.h"
#include "worker/monitor/model_flops.h"
#include "worker/monitor/monitors.h"
#include "worker/torch/jobs/flops_profiler_step.h"

namespace loom::worker {

namespace {

using backends::ReduceOp;
using nlohmann::json;
using Clock = std::chrono::steady_clock;

class Trainer final : public JobRunner {
 public:
  explicit Trainer(RankSetup& rank)
      : rank_(rank), ctx_(rank.context), spec_(rank.spec), ds_(rank.spec.deepspeed), progress_(rank.progress),
        scaler_(rank.spec.deepspeed) {}

  Status setUp();
  Status run() override;

 private:
  Status trainStep();
  // The micro-batches of a step on rollout data: each loss a sum over its response tokens, divided
  // by the step's count of them over every data-parallel rank. Returns the step's loss, summed
  // over the ranks, and adds its statistics to `metrics`.
  StatusOr<double> responseMicroBatches(double scale, std::map<std::string, double>& metrics, at::Tensor& auxSum);
  // The micro-batches of a step on a token file: each the mean loss over its labels, the step's the
  // mean over micro-batches and ranks, which it returns. The load-balancing losses add to auxSum.
  StatusOr<double> tokenMicroBatches(double scale, at::Tensor& auxSum);
  // The samples of micro-batch m of this step on this rank.
  std::vector<int64_t> microBatchSamples(int64_t m);
  // MoE models: the experts' load over the step (rows per expert, max, min, max over mean) and
  // the mean load-balancing loss (aux_loss) when the model adds one; empty for a dense model.
  StatusOr<std::map<std::string, double>> mixtureOfExpertsMetrics(const at::Tensor& auxSum);
  // trainStep under the profiler; rank 0 prints where the step's time went.
  Status profiledTrainStep();
  Status evaluateNow();
  Status saveNow();
  // Whether any rank got SIGTERM (RankSetup::preemptionRequested): every rank asks after each
  // step, so that all of them stop after the same one.
  StatusOr<bool> preemptedAnywhere();
  // After a preemption: the checkpoint of this step (when the job checkpoints), then the status
  // that makes the rank exit kExitPreempted.
  Status stopForPreemption();
  // The model's whole tensors, one at a time, for the checkpoint (checkpoint.h).
  WeightStream weightStream();
  Status resume();
  // The data-parallel group of the gradients, dp x sp: they are averaged and ZeRO-partitioned
  // over it.
  backends::Communicator& dp() { return *rank_.mesh.denseData; }
  // The ranks that share the samples of a batch, dp (each sequence-parallel group takes its
  // samples together), and the ranks that share each sample's tokens.
  backends::Communicator& samplesGroup() { return *rank_.mesh.data; }
  backends::Communicator& sp() { return *rank_.mesh.sequence; }
  int tp() const { return rank_.mesh.tensor->size(); }
  std::map<std::string, double> memoryMetrics() const;
  std::vector<MonitorEvent> monitorEvents(double loss) const;
  // wall_clock_breakdown: rank 0 prints the micro-batch's timer line (DeepSpeed's, after each
  // engine.step() call).
  void printMicroStepTimes();
  // Whether each rank's file holds its optimizer state: under ZeRO (its partition) and under
  // tensor parallelism (its pieces); else rank 0 saves the one whole state.
  // Under expert parallelism each rank holds its own experts' state, at every stage.
  bool statePerRank() const { return checkpoint::statePerRank(ds_.zero.stage, tp(), ep()); }
  int ep() const { return rank_.mesh.expert->size(); }
  // The convert job that rewrites train.checkpoint_dir for this job's layout (JSON, for errors).
  std::string convertJobForThisLayout() const;

  RankSetup& rank_;
  const RankContext& ctx_;
  const planner::JobSpec& spec_;
  const planner::DeepSpeedConfig& ds_;
  const TorchRuntime::ProgressFn& progress_;

  BuiltModel built_;
  std::unique_ptr<ZeroEngine> zero_;
  train::LossScaler scaler_;
  std::optional<TokenSamples> train_, eval_;
  std::unique_ptr<ResponseTraining> responses_;  // data.format rollout, in place of train_
  std::unique_ptr<train::SampleOrder> order_;
  std::unique_ptr<Monitors> monitors_;  // rank 0's tensorboard, csv_monitor and wandb files, when enabled
  std::optional<WallClockBreakdown> clock_;  // deepspeed.wall_clock_breakdown (timing nothing when off)
  std::optional<FlopsProfilerStep> flops_;   // deepspeed.flops_profiler (inert when off)
  // The mfu metric's terms: 0 where unknown (the CPU, an unlisted GPU, MoE models), and no mfu.
  double flopsPerToken_ = 0;
  double peakFlops_ = 0;

  int64_t step_ = 0;          // optimizer steps taken (global_steps)
  int64_t appliedSteps_ = 0;  // ... of which not skipped for an fp16 overflow; the schedule's clock
  int64_t skippedSteps_ = 0;
  int64_t lastSavedStep_ = -1;
};

std::map<std::string, double> Trainer::memoryMetrics() const {
  const ZeroMemory m = zero_->memory();
  return {{"memory.parameter_bytes", static_cast<double>(m.parameterBytes)},
          {"memory.gradient_bytes", static_cast<double>(m.gradientBytes)},
          {"memory.optimizer_state_bytes", static_cast<double>(m.optimizerStateBytes)},
          {"memory.peak_rss_bytes", static_cast<double>(process::peakResidentBytes())},
          {"memory.device_peak_bytes", static_cast<double>(devicePeakBytes(built_.model->device()))}};
}

Status Trainer::setUp() {
  if (ctx_.rank == 0) {
    ASSIGN_OR_RETURN(monitors_, Monitors::open(ds_));
  }
  ASSIGN_OR_RETURN(built_, buildModel(spec_, rank_.local, rank_.device, rank_.mesh));
  clock_.emplace(built_.model->device(), ds_.wallClockBreakdown);
  flops_.emplace(ds_, ctx_.rank, *built_.model);
  const auto& config = built_.model->config();
  int64_t numSamples = 0;
  if (spec_.data.format == planner::DataFormat::kRollout) {
    ASSIGN_OR_RETURN(responses_, ResponseTraining::create(rank_, *built_.model));
    numSamples = responses_->numSamples();
  } else {
    ASSIGN_OR_RETURN(auto train, TokenSamples::open(spec_.data.train, spec_.data.seqLen, config.vocabSize, "data.train"));
    train_.emplace(std::move(train));
    numSamples = train_->numSamples();
  }
  if (!spec_.data.eval.empty()) {
    ASSIGN_OR_RETURN(auto eval, TokenSamples::open(spec_.data.eval, spec_.data.seqLen, config.vocabSize, "data.eval"));
    eval_.emplace(std::move(eval));
  }
  order_ = std::make_unique<train::SampleOrder>(numSamples, static_cast<uint64_t>(spec_.data.seed));

  const int64_t parameterCount = rank_.plan.totalElements();
  flopsPerToken_ = trainingFlopsPerToken(config, parameterCount, spec_.data.seqLen);
  peakFlops_ = peakFlopsPerSecond(deviceName(built_.model->device()), ds_.precision) * rank_.plan.mesh.world;
  // The ZeRO partitions are the Plan's, laid out for this data-parallel group.
  RETURN_IF_ERROR(checkZeroPlan(ds_, rank_.local, *built_.model, dp()));
  zero_ = makeZeroEngine(ds_, rank_.local, *built_.model,
                         {.dense = &dp(), .expertData = rank_.mesh.expertData.get(), .expert = rank_.mesh.expert.get()});
  if (spec_.train.resume && !spec_.train.checkpointDir.empty()) RETURN_IF_ERROR(resume());

  if (ctx_.rank == 0) {
    const int64_t count = parameterCount;
    std::printf("model: %s, %.2fM parameters, %s; data: %lld samples of %lld tokens; batch %lld = micro %lld x "
                "accumulation %lld x %d data-parallel ranks; optimizer %s; ZeRO stage %d; %s\n",
                planner::modelFamilyName(config.family), count / 1e6, planner::precisionName(ds_.precision),
                static_cast<long long>(numSamples), static_cast<long long>(spec_.data.seqLen),
                static_cast<long long>(ds_.trainBatchSize), static_cast<long long>(ds_.microBatchSize),
                static_cast<long long>(ds_.gradientAccumulationSteps), samplesGroup().size(),
                planner::optimizerTypeName(ds_.optimizer.type), ds_.zero.stage, rank_.mesh.describe().c_str());
    std::printf("kernels: %s\n", kernelRegistry().describe().c_str());
    if (responses_) std::printf("%s\n", responses_->describe().c_str());
  }
  return Status::ok();
}

std::string Trainer::convertJobForThisLayout() const {
  const std::string& dir = spec_.train.checkpointDir;
  const planner::PlanMesh& m = rank_.plan.mesh;
  json layout{{"ranks", m.world}, {"zero_stage", ds_.zero.stage}, {"autotp_size", m.tp}, {"sequence_parallel_size", m.sp}};
  if (built_.model->config().isMoe()) layout["autoep_size"] = m.ep;  // also 1: the checkpoint's may be another
  if (ds_.zero.stage == 3) {
    layout["stage3_param_persistence_threshold"] = ds_.zero.paramPersistenceThreshold;
    layout["stage3_model_persistence_threshold"] = ds_.zero.modelPersistenceThreshold;
  }
  const json job{{"name", spec_.name + "-convert"},
                 {"kind", "convert"},
                 {"convert",
                  {{"from", dir},
                   {"to", "loom"},
                   {"output", fmt::format("{}-{}ranks-zero{}", dir, m.world, ds_.zero.stage)},
                   {"layout", layout}}}};
  return job.dump();
}

Status Trainer::resume() {
  auto loaded = loadNewestGoodCheckpoint(spec_.train.checkpointDir, ctx_.rank);
  if (!loaded.isOk()) return loaded.status().withContext("train.checkpoint_dir");
  if (!*loaded) return Status::ok();
  if (ctx_.rank == 0) {
    for (const std::string& refused : (*loaded)->refused) {
      const std::string what = "checkpoint refused, an older one is used: " + refused;
      std::printf("%s\n", what.c_str());
      if (rank_.notice) rank_.notice(what);  // an event of the job's, as well as a log line
    }
  }
  auto& c = (*loaded)->contents;
  const json& t = c.trainer;
  const std::string where = spec_.train.checkpointDir + "/" + t.value("tag", std::string("?"));
  if (t.value("train_batch_size", int64_t(0)) != ds_.trainBatchSize)
    return failedPrecondition("{}: written with train_batch_size {}, this job has {}: the data position would not "
                              "carry over",
                              where, t.value("train_batch_size", int64_t(0)), ds_.trainBatchSize);
  // A checkpoint whose ranks hold their own state (a ZeRO partition, tensor-parallel pieces) loads
  // at its own stage, tensor parallelism and data-parallel size only; a stage 0 checkpoint without
  // tensor parallelism at any size. Another layout is a convert job away.
  const int writtenTp = t.value("tensor_parallel", 1), stage = t.value("zero_stage", 0);
  const int writtenEp = t.value("expert_parallel", 1);
  if (writtenEp != ep())
    return failedPrecondition("{}: written at expert parallel {}, this job runs expert parallel {}: each rank's file "
                              "holds the experts of its own expert-parallel index, so it resumes at its own ep only. "
                              "Convert it to this job's layout first, then point train.checkpoint_dir at the output: {}",
                              where, writtenEp, ep(), convertJobForThisLayout());
  const int writtenDp = t.value("dp_world_size", dp().size());
  // Stage 3's parts also depend on which parameters its thresholds keep whole.
  const json writtenZero = t.value("deepspeed", json::object()).value("zero_optimization", json::object());
  const int64_t writtenParam = writtenZero.value("stage3_param_persistence_threshold", ds_.zero.paramPersistenceThreshold);
  const int64_t writtenModel = writtenZero.value("stage3_model_persistence_threshold", ds_.zero.modelPersistenceThreshold);
  const bool samePersistence = stage != 3 || (writtenParam == ds_.zero.paramPersistenceThreshold &&
                                              writtenModel == ds_.zero.modelPersistenceThreshold);
  auto thresholds = [&](int64_t param, int64_t model) {
    return samePersistence ? std::string() : fmt::format(" (stage 3 persistence thresholds {} and {})", param, model);
  };
  if (writtenTp != tp() || stage != ds_.zero.stage || (statePerRank() && writtenDp != dp().size()) || !samePersistence)
    return failedPrecondition(
        "{}: written at ZeRO stage {}, tensor parallel {} x {} data-parallel ranks{}; this job runs stage {}, tensor "
        "parallel {} x {}{}: its ranks hold their own optimizer state, so it resumes at its own layout only. Convert "
        "it to this job's layout first, then point train.checkpoint_dir at the output: {}",
        where, stage, writtenTp, writtenDp, thresholds(writtenParam, writtenModel), ds_.zero.stage, tp(), dp().size(),
        thresholds(ds_.zero.paramPersistenceThreshold, ds_.zero.modelPersistenceThreshold), convertJobForThisLayout());
  // The frozen set decides what the optimizer state covers: it must be the one the checkpoint
  // was written with.
  const auto frozen = t.value("frozen_parameters", std::vector<std::string>{});
  if (frozen != spec_.train.frozenParameters)
    return failedPrecondition("{}: written with train.frozen_parameters [{}], this job has [{}]", where,
                              fmt::format("{}", fmt::join(frozen, ", ")),
                              fmt::format("{}", fmt::join(spec_.train.frozenParameters, ", ")));
  // Stage 3 restores its trainable parts from the fp32 masters and its frozen ones from the
  // checkpoint's weights; the others load the weights.
  if (stage < 3) RETURN_IF_ERROR(built_.model->loadWeights(c.model, where));
  TensorMap state = statePerRank() ? c.rank : c.optimizer;
  if (stage == 3) {
    for (const auto& [name, weight] : c.model)
      if (spec_.train.freezes(name)) state["frozen." + name] = weight;
  }
  // train.resume_optimizer false leaves out another job's optimizer state; this job's own
  // checkpoints (a restart, a preemption) resume whole.
  const bool ownCheckpoint = t.value("job_id", std::string()) == ctx_.jobId;
  const bool optimizerState = ownCheckpoint || spec_.train.resumeOptimizer;
  RETURN_IF_ERROR(zero_->restore(state, where, optimizerState));
  if (optimizerState) RETURN_IF_ERROR(scaler_.restore(t.at("loss_scaler")));
  step_ = t.at("step").get<int64_t>();
  appliedSteps_ = t.at("applied_steps").get<int64_t>();
  skippedSteps_ = t.at("skipped_steps").get<int64_t>();
  if (auto rng = c.rank.find("rng"); rng != c.rank.end()) {
    at::Generator generator = at::detail::getDefaultCPUGenerator();
    generator.set_state(rng->second);
  }
  lastSavedStep_ = step_;
  if (ctx_.rank == 0)
    std::printf("resumed from %s at step %lld%s\n", where.c_str(), static_cast<long long>(step_),
                optimizerState ? "" : " with a fresh optimizer state (train.resume_optimizer is false)");
  return Status::ok();
}

Status Trainer::trainStep() {
  const auto started = Clock::now();
  const int64_t seq = spec_.data.seqLen;
  const double scale = scaler_.scale();
  zero_->zeroGradients();
  built_.model->takeExpertLoad();  // what evaluation between steps routed is not the step's load
  using Metrics = std::map<std::string, double>;
  Metrics dataMetrics;
  at::Tensor auxSum;
  double loss = 0;
  if (responses_) {
    ASSIGN_OR_RETURN(loss, responseMicroBatches(scale, dataMetrics, auxSum));
  } else {
    ASSIGN_OR_RETURN(loss, tokenMicroBatches(scale, auxSum));
  }
  const double tokens = responses_ ? dataMetrics["input_tokens"] : static_cast<double>(ds_.trainBatchSize * seq);
  at::NoGradGuard noGrad;
  ASSIGN_OR_RETURN(Metrics moeMetrics, mixtureOfExpertsMetrics(auxSum));
  const bool profiled = flops_->profiles(step_);
  clock_->start(WallClockBreakdown::kBackwardReduce);
  double gradNorm = 0;
  {
    FlopsProfilerStep::Timed timed(*flops_, profiled, FlopsProfilerStep::kBackward);
    ASSIGN_OR_RETURN(gradNorm, zero_->reduce(scale));
  }
  clock_->stop(WallClockBreakdown::kBackwardReduce);
  const bool overflow = ds_.skipsNonFiniteSteps() && !std::isfinite(gradNorm);
  const train::LearningRates rates = train::learningRates(ds_.scheduler, ds_.optimizer, appliedSteps_);
  const double lr = rates.lr;
  if (overflow) {
    ++skippedSteps_;
    if (ctx_.rank == 0) {
      if (ds_.precision == planner::Precision::kFp16) {
        std::printf("step %lld: fp16 gradients overflow at loss scale %g: step skipped\n",
                    static_cast<long long>(step_ + 1), scale);
      } else {
        std::printf("step %lld: bf16 gradient norm is not finite: step skipped\n", static_cast<long long>(step_ + 1));
      }
    }
  } else {
    const double clip = ds_.gradientClipping > 0 ? std::min(1.0, ds_.gradientClipping / (gradNorm + 1e-6)) : 1.0;
    clock_->start(WallClockBreakdown::kStep);
    {
      FlopsProfilerStep::Timed timed(*flops_, profiled, FlopsProfilerStep::kStep);
      RETURN_IF_ERROR(zero_->step(rates, clip));
    }
    clock_->stop(WallClockBreakdown::kStep);
    ++appliedSteps_;
  }
  RETURN_IF_ERROR(scaler_.update(overflow));
  ++step_;
  if (profiled) RETURN_IF_ERROR(flops_->report(step_, ctx_.worldSize, dp().size(), tp()));

  const double seconds = std::chrono::duration<double>(Clock::now() - started).count();
  std::map<std::string, double> metrics{{"loss", loss},
                                        {"lr", lr},
                                        {"tokens_per_s", tokens / seconds},
                                        {"step_time_s", seconds},
                                        {"samples", static_cast<double>(step_ * ds_.trainBatchSize)},
                                        {"skipped_steps", static_cast<double>(skippedSteps_)},
                                        {"progress", static_cast<double>(step_) / spec_.train.steps}};
  if (!overflow) metrics["grad_norm"] = gradNorm;
  if (flopsPerToken_ > 0 && peakFlops_ > 0) metrics["mfu"] = tokens / seconds * flopsPerToken_ / peakFlops_;
  metrics.merge(moeMetrics);
  metrics.merge(dataMetrics);
  if (ds_.optimizer.type == planner::OptimizerType::kMuon) metrics["muon_lr"] = rates.muonLr;
  if (step_ == 1 || step_ % ds_.stepsPerPrint == 0) metrics.merge(memoryMetrics());
  if (step_ == 1 && ctx_.rank == 0) {
    const ZeroMemory m = zero_->memory();
    const int64_t devicePeak = devicePeakBytes(built_.model->device());
    std::printf("memory per rank (ZeRO stage %d): parameters %s, gradients %s, optimizer state %s, peak RSS %s%s\n",
                ds_.zero.stage, humanBytes(m.parameterBytes).c_str(), humanBytes(m.gradientBytes).c_str(),
                humanBytes(m.optimizerStateBytes).c_str(), humanBytes(process::peakResidentBytes()).c_str(),
                devicePeak ? (", device peak " + humanBytes(devicePeak)).c_str() : "");
  }  // an overflowed step has no norm (and JSON has no NaN)
  if (ds_.precision == planner::Precision::kFp16) metrics["loss_scale"] = scaler_.scale();
  progress_(step_, metrics);
  if (monitors_) RETURN_IF_ERROR(monitors_->write(monitorEvents(loss)));
  if (clock_->enabled()) {
    printMicroStepTimes();
    if (monitors_) RETURN_IF_ERROR(monitors_->write(clock_->events(step_ * ds_.trainBatchSize)));
    const std::string line = clock_->stepLine();
    if (ctx_.rank == 0) std::printf("[Rank 0] %s\n", line.c_str());
  }
  if (ctx_.rank == 0 && (step_ % ds_.stepsPerPrint == 0 || step_ == 1 || step_ == spec_.train.steps)) {
    std::printf("step %lld/%lld: loss %.6f lr %.6g grad_norm %.6g tokens/s %.0f%s\n", static_cast<long long>(step_),
                static_cast<long long>(spec_.train.steps), loss, lr, gradNorm, tokens / seconds,
                ds_.precision == planner::Precision::kFp16
                    ? fmt::format(" loss_scale {} skipped {}", scaler_.scale(), skippedSteps_).c_str()
                    : "");
    std::fflush(stdout);
  }
  return Status::ok();
}

// What DeepSpeed's engine writes after an optimizer step, at its global_samples: the lr its
// optimizer now holds (the scheduler has moved it on for the next step) and, under fp16, the loss
// scale; and the step's loss under the tag DeepSpeed's pipeline engine gives it.
std::vector<MonitorEvent> Trainer::monitorEvents(double loss) const {
  const int64_t samples = step_ * ds_.trainBatchSize;
  std::vector<MonitorEvent> events{
      {"Train/Samples/train_loss", loss, samples},
      {"Train/Samples/lr", train::learningRates(ds_.scheduler, ds_.optimizer, appliedSteps_).lr, samples}};
  if (ds_.precision == planner::Precision::kFp16) events.push_back({"Train/Samples/loss_scale", scaler_.scale(), samples});
  return events;
}

void Trainer::printMicroStepTimes() {
  if (!clock_->enabled()) return;
  const std::string line = clock_->microStepLine();
  if (ctx_.rank == 0) std::printf("[Rank 0] %s\n", line.c_str());
}

std::vector<int64_t> Trainer::microBatchSamples(int64_t m) {
  const int64_t micro = ds_.microBatchSize;
  const int64_t start =
      train::microBatchStart(step_, ds_.trainBatchSize, m, micro, samplesGroup().rank(), samplesGroup().size());
  std::vector<int64_t> samples;
  for (int64_t i = 0; i < micro; ++i) samples.push_back(order_->sampleAt(start + i));
  return samples;
}

StatusOr<double> Trainer::tokenMicroBatches(double scale, at::Tensor& auxSum) {
  const int64_t gas = ds_.gradientAccumulationSteps;
  const int dpSize = samplesGroup().size(), spSize = sp().size();
  const at::Device device = built_.model->device();
  const bool profiled = flops_->profiles(step_);
  // Summed on the device: reading each micro-batch's loss would stop the host until the GPU
  // catches up, before it could queue the backward.
  at::Tensor lossSum;
  for (int64_t m = 0; m < gas; ++m) {
    const TokenBatch batch = train_->batch(microBatchSamples(m), spec_.data.packDocuments, sp().rank(), spSize);
    // This rank's part of the micro-batch's mean loss, weighted by its share of the labels: over
    // the sequence-parallel group the parts add up to the mean over the whole samples.
    clock_->start(WallClockBreakdown::kForward);
    at::Tensor part;
    {
      FlopsProfilerStep::Timed timed(*flops_, profiled, FlopsProfilerStep::kForward);
      part = built_.model->loss(batch.inputs.to(device), batch.labels.to(device), batch.layout.to(device)) *
             batch.share();
    }
    clock_->stop(WallClockBreakdown::kForward);
    lossSum = lossSum.defined() ? lossSum + part.detach().to(at::kDouble) : part.detach().to(at::kDouble);
    if (const at::Tensor& aux = built_.model->auxLoss(); aux.defined())
      auxSum = auxSum.defined() ? auxSum + aux.detach().to(at::kDouble) : aux.detach().to(at::kDouble);
    // DeepSpeed scales by 1 / gradient_accumulation_steps: the step's gradient is the mean. The
    // gradients are averaged over dp x sp, where the parts over sp are to be summed: hence x sp.
    clock_->start(WallClockBreakdown::kBackwardInner);
    {
      FlopsProfilerStep::Timed timed(*flops_, profiled, FlopsProfilerStep::kBackward);
      (part * (scale * spSize / static_cast<double>(gas))).backward();
      RETURN_IF_ERROR(zero_->accumulate());
    }
    clock_->stop(WallClockBreakdown::kBackwardInner);
    if (m + 1 < gas) printMicroStepTimes();  // the last one's line follows the optimizer step
  }
  at::NoGradGuard noGrad;
  double loss = lossSum.item<double>() / static_cast<double>(gas);
  if (dp().size() > 1) {
    // Summed over the sequence-parallel parts, averaged over the data-parallel replicas.
    at::Tensor lossTensor = at::tensor({loss}, at::kDouble).to(device);
    RETURN_IF_ERROR(dp().allReduce(lossTensor, ReduceOp::kSum)->wait().withContext("loss all-reduce"));
    loss = lossTensor.item<double>() / dpSize;
  }
  return loss;
}

StatusOr<double> Trainer::responseMicroBatches(double scale, std::map<std::string, double>& metrics,
                                               at::Tensor& auxSum) {
  const int64_t gas = ds_.gradientAccumulationSteps;
  const at::Device device = built_.model->device();
  const int dpSize = samplesGroup().size();
  const bool profiled = flops_->profiles(step_);
  std::vector<std::vector<int64_t>> batches;
  double responseTokens = 0, inputTokens = 0;
  for (int64_t m = 0; m < gas; ++m) {
    batches.push_back(microBatchSamples(m));
    responseTokens += static_cast<double>(responses_->responseTokens(batches.back()));
    inputTokens += static_cast<double>(responses_->inputTokens(batches.back()));
  }
  // The step's response tokens over every rank: each micro-batch's sum is divided by them.
  at::Tensor totals = at::tensor({responseTokens, inputTokens}, at::kDouble).to(device);
  if (dpSize > 1)
    RETURN_IF_ERROR(samplesGroup().allReduce(totals, ReduceOp::kSum)->wait().withContext("response token count all-reduce"));
  totals = totals.cpu();
  const double stepTokens = std::max(1.0, totals[0].item<double>());
  at::Tensor lossSum;
  for (size_t m = 0; m < batches.size(); ++m) {
    clock_->start(WallClockBreakdown::kForward);
    at::Tensor part;
    {
      FlopsProfilerStep::Timed timed(*flops_, profiled, FlopsProfilerStep::kForward);
      part = responses_->lossSum(*built_.model, batches[m]) / stepTokens;
    }
    clock_->stop(WallClockBreakdown::kForward);
    lossSum = lossSum.defined() ? lossSum + part.detach().to(at::kDouble) : part.detach().to(at::kDouble);
    // The gradients are averaged over the data-parallel ranks, where the ranks' parts are to be
    // summed: hence x dp. The router's load-balancing loss is a mean over micro-batches, as ever.
    at::Tensor objective = part * static_cast<double>(dpSize);
    if (const at::Tensor aux = built_.model->takeRouterAuxLoss(); aux.defined()) {
      objective = objective + aux.to(objective.scalar_type()) / static_cast<double>(gas);
      const at::Tensor raw = built_.model->auxLoss().detach().to(at::kDouble);
      auxSum = auxSum.defined() ? auxSum + raw : raw;
    }
    clock_->start(WallClockBreakdown::kBackwardInner);
    {
      FlopsProfilerStep::Timed timed(*flops_, profiled, FlopsProfilerStep::kBackward);
      (objective * scale).backward();
      RETURN_IF_ERROR(zero_->accumulate());
    }
    clock_->stop(WallClockBreakdown::kBackwardInner);
    if (m + 1 < batches.size()) printMicroStepTimes();  // the last one's line follows the optimizer step
  }
  at::NoGradGuard noGrad;
  if (dpSize > 1)
    RETURN_IF_ERROR(samplesGroup().allReduce(lossSum, ReduceOp::kSum)->wait().withContext("loss all-reduce"));
  ASSIGN_OR_RETURN(metrics, responses_->takeStepMetrics(samplesGroup(), stepTokens));
  metrics["input_tokens"] = totals[1].item<double>();
  return lossSum.cpu().item<double>();
}

StatusOr<std::map<std::string, double>> Trainer::mixtureOfExpertsMetrics(const at::Tensor& auxSum) {
  std::map<std::string, double> out;
  const std::vector<int64_t> load = built_.model->takeExpertLoad();
  if (load.empty()) return out;
  // The step's rows per expert, over the MoE layers and every rank's tokens; with it the mean
  // load-balancing loss of the micro-batches, over the ranks.
  const int64_t experts = static_cast<int64_t>(load.size());
  at::Tensor summed = at::zeros({experts + 1}, at::kDouble);
  for (int64_t e = 0; e < experts; ++e) summed[e] = static_cast<double>(load[e]);
  if (auxSum.defined()) summed[experts] = auxSum.cpu().item<double>() / ds_.gradientAccumulationSteps;
  if (dp().size() > 1) {
    at::Tensor onDevice = summed.to(built_.model->device());
    RETURN_IF_ERROR(dp().allReduce(onDevice, ReduceOp::kSum)->wait().withContext("expert load all-reduce"));
    summed = onDevice.cpu();
  }
  const at::Tensor rows = summed.narrow(0, 0, experts);
  const double mean = rows.mean().item<double>();
  out["expert_load_max"] = rows.max().item<double>();
  out["expert_load_min"] = rows.min().item<double>();
  out["expert_load_imbalance"] = mean > 0 ? out["expert_load_max"] / mean : 0;
  if (auxSum.defined()) out["aux_loss"] = summed[experts].item<double>() / dp().size();
  if (ctx_.rank == 0 && (step_ + 1 == 1 || (step_ + 1) % ds_.stepsPerPrint == 0)) {
    std::vector<int64_t> perExpert(experts);
    for (int64_t e = 0; e < experts; ++e) perExpert[e] = static_cast<int64_t>(rows[e].item<double>());
    std::printf("step %lld: expert load (rows per expert, all MoE layers) [%s]%s\n", static_cast<long long>(step_ + 1),
                fmt::format("{}", fmt::join(perExpert, ", ")).c_str(),
                auxSum.defined() ? fmt::format(" aux_loss {:.6f}", out["aux_loss"]).c_str() : "");
  }
  return out;
}

Status Trainer::profiledTrainStep() {
  const at::Device device = built_.model->device();
  synchronize(device);  // the step starts with nothing queued before it
  const auto started = Clock::now();
  std::optional<StepProfiler> profiler;
  if (ctx_.rank == 0) profiler.emplace(device);
  RETURN_IF_ERROR(trainStep());
  synchronize(device);
  const double ms = std::chrono::duration<double, std::milli>(Clock::now() - started).count();
  if (profiler) {
    std::printf("profile of step %lld (train.profile_step):\n%s", static_cast<long long>(step_),
                profiler->report(ms).c_str());
    std::fflush(stdout);
  }
  return Status::ok();
}

Status Trainer::evaluateNow() {
  ASSIGN_OR_RETURN(EvalResult r, evaluate(*built_.model, *eval_,
                                          {.microBatchSize = ds_.microBatchSize,
                                           .maxBatches = spec_.train.evalBatches,
                                           .packDocuments = spec_.data.packDocuments},
                                          rank_.mesh));
  progress_(step_, {{"eval_loss", r.meanLoss}});
  if (monitors_) RETURN_IF_ERROR(monitors_->write({{"Train/Samples/eval_loss", r.meanLoss, step_ * ds_.trainBatchSize}}));
  if (ctx_.rank == 0) {
    std::printf("step %lld: eval_loss %.4f over %lld samples\n", static_cast<long long>(step_), r.meanLoss,
                static_cast<long long>(r.samples));
    std::fflush(stdout);
  }
  return Status::ok();
}

WeightStream Trainer::weightStream() {
  // Every rank gathers each whole tensor with the others: stage 3 its parts over its ZeRO group,
  // then tensor parallelism its pieces; an expert then goes from the rank of each expert-parallel
  // group that holds it to the others. Every expert of the model is in the stream, by HF name.
  WeightStream stream;
  const DecoderModel& model = *built_.model;
  const std::vector<planner::ParameterSpec>& all = rank_.plan.parameters;
  std::vector<int> local(all.size(), -1);  // the whole Plan's parameter -> this rank's model parameter
  for (size_t i = 0, m = 0; i < all.size() && m < model.parameters().size(); ++i)
    if (all[i].name == model.parameters()[m].first) local[i] = static_cast<int>(m++);
  for (const planner::ParameterSpec& p : all) stream.entries.push_back({p.name, model.dtype(), p.shape});
  stream.produce = [this, local](size_t i) -> StatusOr<at::Tensor> {
    const planner::ParameterSpec& p = rank_.plan.parameters[i];
    at::Tensor whole;
    if (local[i] >= 0) {
      ASSIGN_OR_RETURN(at::Tensor piece, zero_->weightPiece(local[i]));
      ASSIGN_OR_RETURN(whole, wholeParameter(*built_.model, local[i], piece));
    }
    if (p.expert < 0 || ep() == 1) return whole;
    backends::Communicator& experts = *rank_.mesh.expert;
    at::Tensor wire = built_.model->device().is_cpu()
                          ? experts.allocate(p.shape, built_.model->dtype())
                          : at::empty(p.shape, at::TensorOptions().dtype(built_.model->dtype()).device(built_.model->device()));
    if (whole.defined()) wire.copy_(whole);
    RETURN_IF_ERROR(experts.broadcast(wire, p.expertOwner)->wait().withContext(fmt::format("broadcast of {}", p.name)));
    return wire;
  };
  return stream;
}

Status Trainer::saveNow() {
  CheckpointContents c;
  // ZeRO partitions and tensor-parallel pieces go in each rank's own file; stage 0's whole state
  // once, with the model.
  if (statePerRank()) c.rank = zero_->state();
  c.rank["rng"] = at::detail::getDefaultCPUGenerator().get_state();
  if (ctx_.rank == 0) {
    if (!statePerRank()) c.optimizer = zero_->state();
    c.modelConfig = built_.configText;
    c.trainer = {{"job_id", ctx_.jobId},
                 {"step", step_},
                 {"applied_steps", appliedSteps_},
                 {"skipped_steps", skippedSteps_},
                 {"consumed_samples", step_ * ds_.trainBatchSize},
                 {"train_batch_size", ds_.trainBatchSize},
                 {"dp_world_size", dp().size()},
                 {"tensor_parallel", tp()},
                 {"expert_parallel", ep()},
                 {"sequence_parallel", sp().size()},
                 {"zero_stage", ds_.zero.stage},
                 {"frozen_parameters", spec_.train.frozenParameters},
                 {"data_seed", spec_.data.seed},
                 {"loss_scaler", scaler_.state()},
                 {"deepspeed", ds_.toJson()}};
  }
  const auto started = Clock::now();
  RETURN_IF_ERROR(saveCheckpoint(spec_.train.checkpointDir, step_, c, weightStream(), ctx_.rank, rank_.mesh.world.get(),
                                 static_cast<int>(spec_.train.keepCheckpoints)));
  lastSavedStep_ = step_;
  if (ctx_.rank == 0) {
    std::printf("step %lld: checkpoint %s/%s written in %.2f s\n", static_cast<long long>(step_),
                spec_.train.checkpointDir.c_str(), checkpointTag(step_).c_str(),
                std::chrono::duration<double>(Clock::now() - started).count());
    std::fflush(stdout);
  }
  return Status::ok();
}

StatusOr<bool> Trainer::preemptedAnywhere() {
  if (!rank_.preemptionRequested) return false;
  const bool here = rank_.preemptionRequested();
  backends::Communicator& world = *rank_.mesh.world;
  if (world.size() == 1) return here;
  at::Tensor flag = at::full({1}, here ? 1.0 : 0.0, at::kFloat).to(built_.model->device());
  RETURN_IF_ERROR(world.allReduce(flag, ReduceOp::kMax)->wait().withContext("preemption all-reduce"));
  return flag.cpu().item<float>() > 0;
}

Status Trainer::stopForPreemption() {
  const std::string& dir = spec_.train.checkpointDir;
  std::string saved = "no checkpoint (train.checkpoint_dir is not set)";
  if (!dir.empty()) {
    if (lastSavedStep_ != step_) RETURN_IF_ERROR(saveNow().withContext("checkpoint on preemption"));
    saved = fmt::format("checkpoint {}/{}", dir, checkpointTag(step_));
  }
  const std::string what = fmt::format("preempted after step {}; {}", step_, saved);
  if (ctx_.rank == 0) std::printf("SIGTERM: %s\n", what.c_str());
  return preemptedStatus(what);
}

Status Trainer::run() {
  const auto& t = spec_.train;
  while (step_ < t.steps) {
    RETURN_IF_ERROR(step_ + 1 == t.profileStep ? profiledTrainStep() : trainStep());
    if (eval_ && t.evalEvery > 0 && step_ % t.evalEvery == 0) RETURN_IF_ERROR(evaluateNow());
    if (!t.checkpointDir.empty() && t.checkpointEvery > 0 && step_ % t.checkpointEvery == 0)
      RETURN_IF_ERROR(saveNow());
    ASSIGN_OR_RETURN(const bool preempted, preemptedAnywhere());
    if (preempted && step_ < t.steps) return stopForPreemption();
  }
  if (!t.checkpointDir.empty() && lastSavedStep_ != step_) RETURN_IF_ERROR(saveNow());
  if (monitors_) RETURN_IF_ERROR(monitors_->finish());
  if (ctx_.rank == 0) std::printf("training done: %lld steps, %lld skipped\n", static_cast<long long>(step_),
                                  static_cast<long long>(skippedSteps_));
  return rank_.mesh.world->barrier()->wait();
}

}  // namespace

StatusOr<std::unique_ptr<JobRunner>> makeTrainRunner(RankSetup& rank) {
  auto trainer = std::make_unique<Trainer>(rank);
  RETURN_IF_ERROR(trainer->setUp());
  return std::unique_ptr<JobRunner>(std::move(trainer));
}

}  // namespace loom::worker
