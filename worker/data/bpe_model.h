#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/status.h"

namespace loom::data {

// The BPE model of a tokenizer.json: a vocabulary of strings and the merges, in rank order, that
// build longer tokens from shorter ones. Splits one pre-token at a time, exactly as the
// `tokenizers` package's BPE (no dropout, no unknown token, no subword prefix or suffix).
// Thread-safe: the per-word cache is locked.
class BpeModel {
 public:
  struct Merge {
    std::string left;
    std::string right;
  };

  // Errors name the merge (merges[i]) and the token that is not in the vocabulary. A pair
  // listed twice keeps its later rank, as in `tokenizers`.
  // ignoreMerges: a pre-token that is itself in the vocabulary is one token, whatever the merges
  // would have made of it (Llama 3).
  static StatusOr<BpeModel> create(std::unordered_map<std::string, uint32_t> vocab, const std::vector<Merge>& merges,
                                   bool ignoreMerges);
  BpeModel(BpeModel&&) noexcept;
  BpeModel& operator=(BpeModel&&) noexcept;
  ~BpeModel();

  // Appends the ids of `word` (one pre-token, its characters those of the vocabulary). A
  // character not in the vocabulary is dropped, as `tokenizers` does without an unknown token.
  void tokenize(std::string_view word, std::vector<uint32_t>* out) const;

  const std::unordered_map<std::string, uint32_t>& vocab() const { return vocab_; }

 private:
  struct MergeResult {
    uint32_t rank;
    uint32_t id;
  };
  struct Cache;

  BpeModel() = default;
  void merge(std::string_view word, std::vector<uint32_t>* out) const;

  std::unordered_map<std::string, uint32_t> vocab_;
  std::unordered_map<char32_t, uint32_t> charIds_;  // the single-character tokens, by code point
  std::unordered_map<uint64_t, MergeResult> merges_;  // (left id << 32 | right id) -> result
  bool ignoreMerges_ = false;
  std::unique_ptr<Cache> cache_;
};

}  // namespace loom::data
