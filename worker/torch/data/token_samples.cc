#include "worker/torch/data/token_samples.h"

#include <algorithm>

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

namespace {

constexpr int64_t kIgnored = -100;

}  // namespace

TokenBatch TokenSamples::batch(const std::vector<int64_t>& samples, bool packDocuments, int spRank, int sp) const {
  const int64_t rows = static_cast<int64_t>(samples.size()), width = seqLen_ + 1, share = seqLen_ / sp;
  const at::Tensor tokens = gather(samples);
  at::Tensor labels = tokens.slice(1, 1, width).clone();
  TokenBatch out;
  if (packDocuments) {
    // Each token's document: the number of document starts at or before it.
    const std::vector<int64_t>& starts = file_.header().documentStarts;
    at::Tensor documents = at::empty({rows, width}, at::kLong);
    int64_t* d = documents.data_ptr<int64_t>();
    for (int64_t i = 0; i < rows; ++i) {
      const int64_t first = samples[i] * seqLen_;
      for (int64_t t = 0; t < width; ++t)
        d[i * width + t] = std::upper_bound(starts.begin(), starts.end(), first + t) - starts.begin();
    }
    // A label in another document than its input is not a prediction the document makes.
    labels.masked_fill_(documents.slice(1, 1, width) != documents.slice(1, 0, seqLen_), kIgnored);
    // Positions count from the first token of each document within the sample.
    const at::Tensor inputs = documents.slice(1, 0, seqLen_);
    const at::Tensor index = at::arange(seqLen_, at::kLong).expand({rows, seqLen_});
    at::Tensor begins = at::ones({rows, seqLen_}, at::kBool);
    begins.slice(1, 1, seqLen_).copy_(inputs.slice(1, 1, seqLen_) != inputs.slice(1, 0, seqLen_ - 1));
    const at::Tensor documentStart = std::get<0>(at::cummax(at::where(begins, index, 0), 1));
    out.layout.positions = (index - documentStart).slice(1, spRank * share, (spRank + 1) * share).contiguous();
    out.layout.documents = inputs.contiguous();
  }
  out.labelsInSamples = (labels != kIgnored).sum().item<int64_t>();
  out.inputs = tokens.slice(1, spRank * share, (spRank + 1) * share).contiguous();
  out.labels = labels.slice(1, spRank * share, (spRank + 1) * share).contiguous();
  out.labelsCounted = sp == 1 ? out.labelsInSamples : (out.labels != kIgnored).sum().item<int64_t>();
  return out;
}

}  // namespace loom::worker
