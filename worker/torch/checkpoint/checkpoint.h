#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "backends/communicator.h"
#include "common/status.h"
#include "worker/torch/checkpoint/safetensors.h"

namespace loom::worker {

// A training checkpoint, laid out like DeepSpeed's (<dir>/<tag>/, tag global_step<N>, and a
// `latest` file naming the newest tag) but in safetensors with HF names, so that the model of
// any checkpoint loads straight into transformers:
//   model.safetensors (or shards + index)  the weights, in the model's dtype      (rank 0)
//   config.json                             the model's HF config                  (rank 0)
//   optimizer.safetensors                   optimizer state, fp32 master weights   (rank 0)
//   trainer_state.json                      steps, data position, loss scaler, lr  (rank 0)
//   rank_<r>.safetensors                    that rank's RNG state                  (each rank)
//   manifest.json                           every file's size and CRC-32           (rank 0, last)
// Written into a hidden temporary directory, every file fsynced, the manifest written once all
// ranks are done, then renamed into place; `latest` is replaced last. A crash at any point
// leaves the previous checkpoint as `latest`.
struct CheckpointContents {
  TensorMap model;          // loaded: the weights
  TensorMap optimizer;      // rank 0
  nlohmann::json trainer;   // rank 0
  std::string modelConfig;  // rank 0: config.json text
  TensorMap rank;           // every rank
};

std::string checkpointTag(int64_t step);

// The model's weights as a checkpoint writes them: one whole tensor at a time. Every rank calls
// `produce` for every entry in the same order (the ranks gather each tensor together); rank 0
// writes what it returns, so no rank ever holds more than one whole tensor.
struct WeightStream {
  std::vector<TensorEntry> entries;
  TensorProducer produce;
};

// Every rank of `comm` calls it (comm may be null for a single rank). Rank 0 first checks that
// `dir`'s file system has room for it (ResourceExhausted naming the directory and the bytes
// needed, the previous checkpoint left as `latest`); a write that runs out of room later (the disk
// filled meanwhile, a quota, a file-size limit) fails the same way, what was written removed.
// Once it is published it removes all but the newest `keep` complete checkpoints.
Status saveCheckpoint(const std::string& dir, int64_t step, const CheckpointContents& contents,
                      const WeightStream& weights, int rank, backends::Communicator* comm, int keep);

// A checkpoint loaded for resuming, and the newer ones refused on the way (each "<tag dir>: the
// reason", naming the file).
struct LoadedCheckpoint {
  CheckpointContents contents;
  std::vector<std::string> refused;
};

// The newest good checkpoint: the one `latest` names, checked against its manifest, else (when a
// file of it is corrupt, truncated or missing, or its manifest is) the next newest complete one,
// with this rank's file (absent when the checkpoint was written by fewer ranks). Every rank reads
// the same files and so picks the same one. nullopt when `dir` has no `latest`; DataLoss naming
// every refusal when no checkpoint is good.
StatusOr<std::optional<LoadedCheckpoint>> loadNewestGoodCheckpoint(const std::string& dir, int rank);

}  // namespace loom::worker
