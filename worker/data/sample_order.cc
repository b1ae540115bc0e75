#include "worker/data/sample_order.h"

#include <numeric>

namespace loom::train {
namespace {

// SplitMix64: a small, well-mixed generator whose output is fixed by the seed on every platform
// (std::shuffle's distribution is implementation-defined).
uint64_t splitMix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

}  // namespace

SampleOrder::SampleOrder(int64_t numSamples, uint64_t seed) : numSamples_(numSamples), seed_(seed) {}

void SampleOrder::shuffle(int64_t epoch) {
  permutation_.resize(numSamples_);
  std::iota(permutation_.begin(), permutation_.end(), 0);
  uint64_t state = seed_ * 0x100000001b3ULL + static_cast<uint64_t>(epoch);
  // Fisher-Yates; the modulo bias is below 2^-40 for any realistic sample count.
  for (int64_t i = numSamples_ - 1; i > 0; --i) {
    const int64_t j = static_cast<int64_t>(splitMix64(state) % static_cast<uint64_t>(i + 1));
    std::swap(permutation_[i], permutation_[j]);
  }
  epoch_ = epoch;
}

int64_t SampleOrder::sampleAt(int64_t position) {
  const int64_t epoch = position / numSamples_;
  if (epoch != epoch_) shuffle(epoch);
  return permutation_[position % numSamples_];
}

int64_t microBatchStart(int64_t step, int64_t trainBatchSize, int64_t microIndex, int64_t microBatchSize,
                        int64_t dpRank, int64_t dpWorld) {
  return step * trainBatchSize + (microIndex * dpWorld + dpRank) * microBatchSize;
}

}  // namespace loom::train
