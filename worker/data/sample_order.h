#pragma once

#include <cstdint>
#include <vector>

namespace loom::train {

// The order in which a training run visits its samples. Sample i of a token file is the window
// of seq_len + 1 tokens starting at token i * seq_len (inputs and their shifted labels), so a
// file of T tokens has (T - 1) / seq_len samples. Each epoch is a fresh permutation drawn from
// (seed, epoch) alone: every rank computes the same order without talking, and a resumed run
// finds its place from the number of samples already consumed.
//
// Batches are cut from this global order: optimizer step s consumes samples
// [s * train_batch_size, (s + 1) * train_batch_size), and within it micro-batch m of
// data-parallel rank r takes the `micro` samples at offset (m * dp + r) * micro. The samples a
// step sees do not depend on how many ranks share it.
class SampleOrder {
 public:
  SampleOrder(int64_t numSamples, uint64_t seed);

  int64_t numSamples() const { return numSamples_; }
  // The sample at position `position` of the endless sequence of epochs.
  int64_t sampleAt(int64_t position);

 private:
  void shuffle(int64_t epoch);

  int64_t numSamples_;
  uint64_t seed_;
  int64_t epoch_ = -1;
  std::vector<int64_t> permutation_;
};

// The position in the global order of micro-batch `micro` (0-based within the step) of
// data-parallel rank `dpRank` at optimizer step `step`.
int64_t microBatchStart(int64_t step, int64_t trainBatchSize, int64_t microIndex, int64_t microBatchSize,
                        int64_t dpRank, int64_t dpWorld);

}  // namespace loom::train
