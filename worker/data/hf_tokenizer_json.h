#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/status.h"
#include "worker/data/added_tokens.h"
#include "worker/data/bpe_model.h"
#include "worker/data/pre_tokenizer.h"

namespace loom::data {

// What Loom reads of a Hugging Face tokenizer.json: a byte-level BPE tokenizer as Llama 3, Qwen2,
// Qwen3 and Mistral (Tekken) ship them. Plain values; HfTokenizer builds on them.
struct HfTokenizerSpec {
  std::vector<AddedToken> addedTokens;
  bool nfc = false;  // normalizer: NFC (else none)
  // pre_tokenizer: the Split patterns in order, then ByteLevel.
  std::vector<SplitPattern> splits;
  bool addPrefixSpace = false;  // ByteLevel's add_prefix_space: a space before each piece not starting with one
  bool byteLevelSplit = false;  // ByteLevel's use_regex: GPT-2's pattern after the splits
  // model (BPE)
  std::unordered_map<std::string, uint32_t> vocab;
  std::vector<BpeModel::Merge> merges;
  bool ignoreMerges = false;
  // post_processor: TemplateProcessing's `single`, applied when special tokens are added: each
  // item is the encoded text (isText) or the ids of a special token. Empty: nothing is added.
  struct TemplateItem {
    bool isText = false;
    std::vector<uint32_t> ids;
  };
  std::vector<TemplateItem> singleTemplate;
};

// Parses the text of a tokenizer.json. Anything outside what Loom implements is refused, never
// ignored: the error names the field (`model.type`, `pre_tokenizer.pretokenizers[0].pattern.Regex`,
// ...) and what is supported. The caller adds the file's name.
StatusOr<HfTokenizerSpec> parseTokenizerJson(std::string_view text);

}  // namespace loom::data
