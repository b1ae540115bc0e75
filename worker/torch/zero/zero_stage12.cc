#include "worker/torch/zero/zero_stage12.h"

#include <algorithm>
#include <cmath>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include "planner/zero_partition.h"
#include "worker/torch/zero/block_hooks.h"
#include "worker/torch/model/decoder_model.h"
#include "worker/torch/zero/host_step.h"
#include "worker/torch/optim/muon.h"
#include "worker/torch/optim/optimizer.h"
#include "worker/torch/zero/zero_buffers.h"

namespace loom::worker {
namespace {

using backends::ReduceOp;


class ZeroStage12 final : public ZeroEngine, public BlockRunner, public BlockBackwardHooks {
 public:
  ZeroStage12(const planner::DeepSpeedConfig& config, const planner::Plan& plan, DecoderModel& model,
              const ZeroGroups& groups);

  void zeroGradients() override;
  Status accumulate() override;
  StatusOr<double> reduce(double lossScale) override;
  Status step(const train::LearningRates& lr, double clipCoefficient) override;
  // "partition.exp_avg", ..., "master.partition": this rank's parts of every block, end to end
  // (under Muon its state per parameter piece: "<param>.momentum_buffer", "<param>.exp_avg", ...).
  TensorMap state() const override;
  Status restore(const TensorMap& state, const std::string& source, bool optimizerState) override;
  ZeroMemory memory() const override;
  StatusOr<at::Tensor> weightPiece(int parameter) override;

  at::Tensor run(DecoderModel& model, int index, const at::Tensor& input) override;
  void afterBlockBackward(int block) override;

 private:
  // The ranks a part of the partition is cut over: the data-parallel group for the dense
  // blocks, the expert-data-parallel group for the experts' (ZeroGroups). Without expert
  // parallelism both are one group and one domain covers the whole partition.
  struct Domain {
    backends::Communicator* comm = nullptr;
    int rank = 0, size = 1;
    ReduceOp op = ReduceOp::kAvg;
    double scale = 1.0;      // applied to the reduced gradient: 1 / dp after an expert sum
    int64_t begin = 0, numel = 0;  // its range of this rank's partition
    at::Tensor scratch;      // stage 2: the block gradient being reduce-scattered (blockGradient)
    at::Tensor updated;      // this rank's updated part in the model's dtype, all-gathered each step
  };
  struct Block {
    std::vector<std::pair<std::string, at::Tensor>> params;
    std::vector<double> normWeights;  // each parameter's (tensorParallelNormWeight)
    planner::FlatPartition layout;
    int domain = 0;
    int64_t partOffset = 0;  // where its part starts in this rank's partition
    int64_t flatOffset = 0;  // stage 1: where it starts in the whole-gradient buffer
  };
  // A reduce-scatter in flight and where its result goes.
  struct Pending {
    std::shared_ptr<backends::Work> work;
    at::Tensor input, output, into;
    double scale = 1.0;
  };
  // Reduce-scatters `flat` (one block's padded gradient) into that block's part.
  Status reduceBlock(const Block& block, const at::Tensor& flat, bool wait);
  Status finishPending();
  // The block's gradients, fp32, padded: in `blockScratch_` when `reused` (its reduce-scatter
  // ends before the next block's gradients come), else in a tensor of their own.
  at::Tensor blockGradient(const Block& block, bool reused);
  // Muon: one optimizer slot per parameter piece of the partition (a Muon matrix's piece keeps a
  // momentum, the rest Adam's moments), and the updater of its matrices.
  void setUpMuon(const planner::Plan& plan, DecoderModel& model);

  const planner::DeepSpeedConfig& config_;
  int stage_;
  backends::Communicator* comm_;
  const DecoderModel& model_;
  int dp_ = 1;
  int rank_ = 0;
  std::vector<Domain> domains_;
  std::vector<Block> blocks_;
  std::vector<std::vector<int>> blocksOfModelBlock_;  // the model's block -> its indices in blocks_
  int64_t partitionNumel_ = 0;
  at::TensorOptions f32_;  // fp32 on the model's device
  // Where the fp32 masters and the optimizer live: the model's device, or the host with
  // offload_optimizer.device cpu (pinned when the model is on a GPU, for the copies).
  at::TensorOptions hostF32_;

  at::Tensor gradFlat_;  // stage 1
  std::vector<std::vector<at::Tensor>> gradViews_;  // stage 1, per block
  at::Tensor gradPartition_;
  at::Tensor masterPartition_;
  std::unique_ptr<HostStepPipeline> hostStep_;  // offload_optimizer.device cpu
  // The optimizer's slots as [offset, offset + length) of the partition: the whole partition,
  // or under Muon one per parameter piece.
  std::vector<std::pair<int64_t, int64_t>> slots_;
  std::unique_ptr<MuonUpdater> muon_;
  double lossScale_ = 1.0;            // the step's, from reduce()
  std::vector<Pending> pending_;
  std::unique_ptr<Optimizer> optimizer_;
};

ZeroStage12::ZeroStage12(const planner::DeepSpeedConfig& config, const planner::Plan& fullPlan, DecoderModel& model,
                         const ZeroGroups& groups)
    : config_(config), stage_(config.zero.stage), comm_(groups.dense), model_(model),
      f32_(at::TensorOptions().dtype(at::kFloat).device(model.device())),
      hostF32_(config.zero.offloadOptimizer == "cpu"
                   ? at::TensorOptions().dtype(at::kFloat).pinned_memory(model.device().is_cuda() &&
                                                                          config.zero.offloadPinMemory)
                   : f32_) {
  at::NoGradGuard noGrad;
  const planner::ZeroPlan& plan = fullPlan.zero;
  backends::Communicator* comm = comm_;
  dp_ = comm ? comm->size() : 1;
  rank_ = comm ? comm->rank() : 0;
  const bool expertGroups = groups.expertData && groups.expertData->size() != dp_;
  domains_.push_back(Domain{.comm = comm_, .rank = rank_, .size = dp_});
  if (expertGroups)
    domains_.push_back(Domain{.comm = groups.expertData, .rank = groups.expertData->rank(),
                              .size = groups.expertData->size(), .op = ReduceOp::kSum, .scale = 1.0 / dp_});
  blocksOfModelBlock_.assign(model.numBlocks(), {});
  int64_t flatTotal = 0;
  // The Plan's flat buffers, one per block (and per block its experts'); frozen parameters stay
  // whole in the model, out of them and of the optimizer (checkZeroPlan checked the buffers
  // against the group and the model). Under expert parallelism the dense blocks come first and
  // the experts' after them, each domain a range of the partition.
  for (const int domain : expertGroups ? std::vector<int>{0, 1} : std::vector<int>{0}) {
    domains_[domain].begin = partitionNumel_;
    for (const planner::FlatBufferSpec& buffer : plan.buffers) {
      if (expertGroups && buffer.experts != (domain == 1)) continue;
      Block block;
      for (int i : buffer.members[0]) {
        block.params.push_back(model.parameters()[i]);
        block.normWeights.push_back(tensorParallelNormWeight(model.shards().layouts[i], model.tensorParallel().size()));
      }
      block.layout = buffer.partition;
      block.domain = domain;
      block.partOffset = partitionNumel_;
      block.flatOffset = flatTotal;
      partitionNumel_ += block.layout.partitionNumel;
      flatTotal += block.layout.flatNumel;
      blocksOfModelBlock_[buffer.block].push_back(static_cast<int>(blocks_.size()));
      blocks_.push_back(std::move(block));
    }
    domains_[domain].numel = partitionNumel_ - domains_[domain].begin;
  }
  // This rank's part of every block's (padded) parameters, as fp32 masters.
  masterPartition_ = at::zeros({partitionNumel_}, hostF32_);
  for (const auto& block : blocks_) {
    at::Tensor flat = at::zeros({block.layout.flatNumel}, f32_);
    int64_t offset = 0;
    for (const auto& [name, p] : block.params) {
      flat.slice(0, offset, offset + p.numel()).copy_(p.reshape({-1}));
      offset += p.numel();
    }
    const int64_t part = block.layout.partitionNumel;
    const int rank = domains_[block.domain].rank;
    masterPartition_.slice(0, block.partOffset, block.partOffset + part)
        .copy_(flat.slice(0, rank * part, (rank + 1) * part));
  }
  gradPartition_ = at::zeros({partitionNumel_}, f32_);
  if (stage_ == 1) {
    gradFlat_ = collectiveBuffer(comm_, flatTotal, f32_).zero_();
    for (const auto& block : blocks_) gradViews_.push_back(viewsInto(gradFlat_, block.params, block.flatOffset));
  } else {
    model.setBlockRunner(this);
  }
  if (config.optimizer.type == planner::OptimizerType::kMuon) {
    setUpMuon(fullPlan, model);
  } else {
    slots_ = {{0, partitionNumel_}};
    optimizer_ = std::make_unique<Optimizer>(
        config.optimizer, std::vector<std::pair<std::string, at::Tensor>>{{"partition", masterPartition_}});
  }
  if (config.zero.offloadOptimizer == "cpu") hostStep_ = std::make_unique<HostStepPipeline>(config.zero.subGroupSize, config.zero.offloadPinMemory);
}

void ZeroStage12::setUpMuon(const planner::Plan& plan, DecoderModel& model) {
  const auto& buffers = plan.zero.buffers;
  std::vector<std::pair<std::string, at::Tensor>> masters;
  std::vector<bool> muon;
  std::vector<MuonMatrix> matrices;
  std::vector<MuonPiece> pieces;
  for (size_t b = 0; b < blocks_.size(); ++b) {
    const Block& block = blocks_[b];
    const std::vector<int>& members = buffers[b].members[0];
    // Each Muon matrix of the block, with the elements every rank's partition holds of it.
    std::vector<int> matrixOf(members.size(), -1);
    for (size_t j = 0; j < members.size(); ++j) {
      const planner::ParameterSpec& spec = plan.parameters[members[j]];
      if (!spec.muon) continue;
      MuonMatrix m{.parameter = members[j], .headWidth = spec.muonHeadDim, .heldBy = std::vector<int64_t>(dp_, 0)};
      for (int r = 0; r < dp_; ++r) {
        for (const auto& f : block.layout.fragments[r]) {
          if (f.parameter == static_cast<int>(j)) m.heldBy[r] += f.length;
        }
      }
      matrixOf[j] = static_cast<int>(matrices.size());
      matrices.push_back(std::move(m));
    }
    for (const auto& f : block.layout.fragments[rank_]) {
      const int64_t begin = block.partOffset + f.partitionOffset;
      slots_.emplace_back(begin, f.length);
      masters.emplace_back(block.params[f.parameter].first, masterPartition_.slice(0, begin, begin + f.length));
      muon.push_back(matrixOf[f.parameter] >= 0);
      if (muon.back())
        pieces.push_back({.matrix = matrixOf[f.parameter], .grad = gradPartition_.slice(0, begin, begin + f.length),
                          .slot = muon.size() - 1, .momentum = {}});
    }
  }
  optimizer_ = std::make_unique<Optimizer>(config_.optimizer, std::move(masters), muon);
  muon_ = makeMuonUpdater(config_, model, std::move(matrices), std::move(pieces), *optimizer_, comm_);
}

at::Tensor ZeroStage12::run(DecoderModel& model, int index, const at::Tensor& input) {
  // The hook sits on the block's input: it fires once the block's gradients are complete.
  const bool hook = at::GradMode::is_enabled() && input.requires_grad() && !blocksOfModelBlock_[index].empty();
  return model.block(index, hook ? hookAfterBackward(input, this, index) : input);
}

void ZeroStage12::afterBlockBackward(int modelBlock) {
  at::NoGradGuard noGrad;
  const bool wait = !config_.zero.overlapComm;
  for (int b : blocksOfModelBlock_[modelBlock]) {
    const Block& block = blocks_[b];
    // On the host the buffer is shared memory the reduce-scatter works in place in; a GPU gains
    // nothing from reusing it.
    at::Tensor flat = blockGradient(block, /*reused=*/wait && f32_.device().is_cpu());
    for (auto [name, p] : block.params) p.mutable_grad().reset();
    throwIfError(reduceBlock(block, flat, wait));
  }
}

at::Tensor ZeroStage12::blockGradient(const Block& block, bool reused) {
  at::Tensor flat;
  if (reused) {
    // One buffer for every block of a domain, from its communicator's allocate(): on CPU ranks
    // the reduce-scatter then reads it in place from every rank.
    Domain& domain = domains_[block.domain];
    if (!domain.scratch.defined() || domain.scratch.numel() < block.layout.flatNumel) {
      int64_t largest = 0;
      for (const auto& b : blocks_) largest = std::max(largest, b.domain == block.domain ? b.layout.flatNumel : 0);
      domain.scratch = collectiveBuffer(domain.comm, largest, f32_);
    }
    flat = domain.scratch.slice(0, 0, block.layout.flatNumel).zero_();
  } else {
    flat = at::zeros({block.layout.flatNumel}, f32_);
  }
  int64_t offset = 0;
  for (const auto& [name, p] : block.params) {
    if (p.grad().defined()) flat.slice(0, offset, offset + p.numel()).copy_(p.grad().reshape({-1}));
    offset += p.numel();
  }
  return flat;
}

Status ZeroStage12::reduceBlock(const Block& block, const at::Tensor& flat, bool wait) {
  const int64_t part = block.layout.partitionNumel;
  const Domain& domain = domains_[block.domain];
  at::Tensor into = gradPartition_.slice(0, block.partOffset, block.partOffset + part);
  if (!domain.comm) {
    into.add_(flat);
    return Status::ok();
  }
  // In pieces of reduce_bucket_size elements in all: piece k carries elements [k*b, (k+1)*b) of
  // every rank's part, rank after rank, as a reduce-scatter wants them.
  const int64_t perRank = std::max<int64_t>(1, config_.zero.reduceBucketSize / domain.size);
  at::Tensor byRank = flat.view({domain.size, part});
  for (int64_t begin = 0; begin < part; begin += perRank) {
    const int64_t end = std::min(part, begin + perRank);
    Pending p;
    p.input = (begin == 0 && end == part) ? flat : byRank.slice(1, begin, end).contiguous().view({-1});
    p.output = at::empty({end - begin}, f32_);
    p.into = into.slice(0, begin, end);
    p.scale = domain.scale;
    p.work = domain.comm->reduceScatter(p.output, p.input, domain.op);
    pending_.push_back(std::move(p));
  }
  return wait ? finishPending() : Status::ok();
}

Status ZeroStage12::finishPending() {
  at::NoGradGuard noGrad;
  Status status;
  for (auto& p : pending_) {
    Status s = p.work->wait().withContext("ZeRO gradient reduce-scatter");
    if (s.isOk()) {
      p.into.add_(p.output, p.scale);
    } else if (status.isOk()) {
      status = s;
    }
  }
  pending_.clear();
  return status;
}

void ZeroStage12::zeroGradients() {
  if (gradFlat_.defined()) gradFlat_.zero_();
  gradPartition_.zero_();
}

Status ZeroStage12::accumulate() {
  at::NoGradGuard noGrad;
  if (stage_ == 1) {
    for (size_t b = 0; b < blocks_.size(); ++b) {
      for (size_t i = 0; i < blocks_[b].params.size(); ++i) {
        at::Tensor& p = blocks_[b].params[i].second;
        if (p.grad().defined()) gradViews_[b][i].add_(p.grad());
        p.mutable_grad().reset();
      }
    }
    return Status::ok();
  }
  // Blocks whose gradients no hook took (the embedding: its input, the tokens, has no gradient;
  // and anything accumulated after its block's hook ran).
  for (const auto& block : blocks_) {
    bool left = false;
    for (const auto& [name, p] : block.params) left |= p.grad().defined();
    if (!left) continue;
    at::Tensor flat = blockGradient(block, /*reused=*/false);
    for (auto [name, p] : block.params) p.mutable_grad().reset();
    RETURN_IF_ERROR(reduceBlock(block, flat, /*wait=*/false));
  }
  return finishPending();
}

StatusOr<double> ZeroStage12::reduce(double lossScale) {
  at::NoGradGuard noGrad;
  if (stage_ == 1) {
    for (const auto& block : blocks_)
      RETURN_IF_ERROR(reduceBlock(block, gradFlat_.slice(0, block.flatOffset, block.flatOffset + block.layout.flatNumel),
                                  /*wait=*/false));
    RETURN_IF_ERROR(finishPending());
  }
  if (muon_) RETURN_IF_ERROR(muon_->update(lossScale));
  lossScale_ = lossScale;
  backends::Communicator& tp = model_.tensorParallel();
  at::Tensor squares;
  if (tp.size() == 1) {
    squares = flatSquares(gradPartition_);
  } else {
    // The partition's pieces of each parameter, weighted so that the sum over the tensor-parallel
    // group counts each distinct piece once.
    std::vector<at::Tensor> pieces;
    std::vector<double> weights;
    for (const auto& block : blocks_) {
      for (const auto& f : block.layout.fragments[domains_[block.domain].rank]) {
        const int64_t begin = block.partOffset + f.partitionOffset;
        pieces.push_back(gradPartition_.slice(0, begin, begin + f.length));
        weights.push_back(block.normWeights[f.parameter]);
      }
    }
    squares = weightedSquares(pieces, weights, gradPartition_.options());
  }
  if (comm_) RETURN_IF_ERROR(comm_->allReduce(squares, ReduceOp::kSum)->wait().withContext("gradient norm all-reduce"));
  RETURN_IF_ERROR(sumOver(tp, squares, "gradient norm all-reduce over the tensor-parallel group"));
  return std::sqrt(squares.item<double>()) / lossScale;
}

Status ZeroStage12::step(const train::LearningRates& lr, double clipCoefficient) {
  at::NoGradGuard noGrad;
  if (muon_) muon_->commit();
  const double divisor = lossScale_ / clipCoefficient;
  // Every rank's updated part, in the model's dtype, to every rank in one all-gather; then each
  // block's parameters from the dp parts of that block.
  const at::ScalarType dtype = blocks_.front().params.front().second.scalar_type();
  for (Domain& d : domains_)
    if (!d.updated.defined()) d.updated = collectiveBuffer(d.comm, d.numel, f32_.dtype(dtype));
  // The domains' buffers side by side would be one tensor; each is its communicator's own.
  at::Tensor mine = domains_.size() == 1 ? domains_[0].updated : at::empty({partitionNumel_}, f32_.dtype(dtype));
  if (hostStep_) {
    // Offloaded: the step runs on the host, the gradient scaled on the device first (cheap there).
    if (divisor != 1.0) gradPartition_.div_(divisor);
    for (size_t i = 0; i < slots_.size(); ++i) {
      const auto [begin, length] = slots_[i];
      hostStep_->add(i, gradPartition_.slice(0, begin, begin + length), mine.slice(0, begin, begin + length));
    }
    hostStep_->run(*optimizer_, lr);
  } else {
    std::vector<at::Tensor> grads;
    for (const auto& [begin, length] : slots_) grads.push_back(gradPartition_.slice(0, begin, begin + length));
    optimizer_->step(lr, grads, divisor);
    mine.copy_(masterPartition_);
  }
  for (size_t d = 0; d < domains_.size(); ++d) {
    Domain& domain = domains_[d];
    if (domains_.size() > 1) domain.updated.copy_(mine.slice(0, domain.begin, domain.begin + domain.numel));
    at::Tensor all = at::empty({domain.size * domain.numel}, f32_.dtype(dtype));
    if (domain.comm) {
      RETURN_IF_ERROR(domain.comm->allGather(all, domain.updated)->wait().withContext("ZeRO parameter all-gather"));
    } else {
      all.copy_(domain.updated);
    }
    at::Tensor byRank = all.view({domain.size, domain.numel});
    for (const auto& block : blocks_) {
      if (block.domain != static_cast<int>(d)) continue;
      const int64_t begin = block.partOffset - domain.begin;
      at::Tensor flat = byRank.slice(1, begin, begin + block.layout.partitionNumel).reshape({-1});
      std::vector<at::Tensor> views = viewsInto(flat, block.params);
      for (size_t i = 0; i < block.params.size(); ++i) block.params[i].second.copy_(views[i]);
    }
  }
  return Status::ok();
}

TensorMap ZeroStage12::state() const {
  TensorMap out = optimizer_->state();
  out["master.partition"] = masterPartition_;
  return out;
}

Status ZeroStage12::restore(const TensorMap& state, const std::string& source, bool optimizerState) {
  RETURN_IF_ERROR(restoreTensor(state, "master.partition", masterPartition_, source));
  return optimizerState ? optimizer_->restore(state, source) : Status::ok();
}

ZeroMemory ZeroStage12::memory() const {
  ZeroMemory m;
  for (const auto& [name, p] : model_.parameters()) m.parameterBytes += bytesOf(p);
  m.parameterBytes += bytesOf(masterPartition_);
  m.gradientBytes = bytesOf(gradFlat_) + bytesOf(gradPartition_);
  m.optimizerStateBytes = stateBytes(*optimizer_) + (muon_ ? muon_->stagingBytes() : 0);
  return m;
}

StatusOr<at::Tensor> ZeroStage12::weightPiece(int parameter) { return model_.parameters()[parameter].second.detach(); }

}  // namespace

std::unique_ptr<ZeroEngine> makeZeroStage12(const planner::DeepSpeedConfig& config, const planner::Plan& plan,
                                            DecoderModel& model, const ZeroGroups& groups) {
  return std::make_unique<ZeroStage12>(config, plan, model, groups);
}

}  // namespace loom::worker
