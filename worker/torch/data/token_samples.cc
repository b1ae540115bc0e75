#include "worker/torch/data/token_samples.h"

#include <ATen/ATen.h>

namespace loom::worker {

TokenSamples::TokenSamples(data::TokenFile file, int64_t seqLen)
    : file_(std::move(file)), seqLen_(seqLen), numSamples_((file_.size() - 1) / seqLen) {}

StatusOr<TokenSamples> TokenSamples::open(const std::string& path, int64_t seqLen, int64_t modelVocab,
                                          const std::string& field) {
  auto file = data::TokenFile::open(path);
  if (!file.isOk()) return file.status().withContext(field);
  const auto& header = file->header();
  if (header.vocabSize > modelVocab)
    return invalidArgument("{}: {} has vocab_size {}, above the model's vocab_size {}: its token ids would not fit the "
                           "embedding",
                           field, path, header.vocabSize, modelVocab);
  if (file->size() < seqLen + 1)
    return invalidArgument("{}: {} holds {} tokens, fewer than one sample of data.seq_len + 1 = {}", field, path,
                           file->size(), seqLen + 1);
  return TokenSamples(std::move(*file), seqLen);
}

at::Tensor TokenSamples::gather(const std::vector<int64_t>& samples) const {
  const int64_t width = seqLen_ + 1;
  at::Tensor out = at::empty({static_cast<int64_t>(samples.size()), width}, at::kLong);
  int64_t* data = out.data_ptr<int64_t>();
  for (size_t i = 0; i < samples.size(); ++i) file_.read(samples[i] * seqLen_, width, data + i * width);
  return out;
}

}  // namespace loom::worker
