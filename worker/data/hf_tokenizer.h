#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "worker/data/added_tokens.h"
#include "worker/data/bpe_model.h"
#include "worker/data/hf_tokenizer_json.h"

namespace loom::data {

struct EncodeOptions {
  // Apply the post-processor's template (e.g. Llama 3's <|begin_of_text|> in front), as
  // `tokenizers`' encode(text, add_special_tokens=True). Off for pretraining data.
  bool addSpecialTokens = false;
};

// The next piece of a streamed decode: `text` is whole characters only, and `emittedTokens` is
// how many of the ids it and the earlier pieces cover (the next call's starting point).
struct DecodedText {
  std::string text;
  size_t emittedTokens = 0;
};

// A Hugging Face byte-level BPE tokenizer (tokenizer.json), giving the ids the `tokenizers`
// package gives: added tokens split out first, NFC, the Split patterns and ByteLevel, BPE merges,
// the template. Immutable after load except for BPE's locked word cache: every method is
// thread-safe.
class HfTokenizer {
 public:
  // Reads DIR/tokenizer.json, and DIR/tokenizer_config.json (eos_token, bos_token) and
  // DIR/generation_config.json (eos_token_id, bos_token_id) where present. Errors name the file
  // and the field.
  static StatusOr<HfTokenizer> load(const std::string& directory);
  // From the text of a tokenizer.json alone (no eos or bos); `origin` names it in errors.
  static StatusOr<HfTokenizer> fromJson(std::string_view tokenizerJson, const std::string& origin);

  // The ids of `text` (UTF-8; an ill-formed byte is read as U+FFFD).
  std::vector<uint32_t> encode(std::string_view text, const EncodeOptions& options = {}) const;

  // The text of `ids`: each token's bytes (byte-level characters mapped back; an added token
  // outside that alphabet as its UTF-8), joined, then ill-formed UTF-8 replaced by U+FFFD, as
  // `tokenizers`' decode. Ids without a token are skipped, special tokens too when asked.
  std::string decode(std::span<const uint32_t> ids, bool skipSpecialTokens = false) const;

  // For streaming generation: the text that ids[emittedTokens..] add after the text already
  // emitted, up to the last token after which the bytes end on a whole character; a character
  // still missing bytes waits for the next call. With `final`, everything is decoded (a cut
  // character becomes U+FFFD). The pieces joined equal decode(ids) when the last call is final.
  DecodedText decodeIncrementally(std::span<const uint32_t> ids, size_t emittedTokens, bool skipSpecialTokens,
                                  bool final = false) const;

  // One past the largest id, added tokens included: every id is below it.
  int64_t vocabSize() const { return static_cast<int64_t>(tokens_.size()); }
  // The id of a token given by its text (an added token's content, or a vocabulary entry).
  std::optional<uint32_t> tokenId(std::string_view token) const;
  // The ends of a sequence: tokenizer_config.json's eos_token first (the end of a document), then
  // generation_config.json's eos_token_id entries. Empty when neither file names one.
  const std::vector<uint32_t>& eosTokenIds() const { return eosTokenIds_; }
  std::optional<uint32_t> bosTokenId() const { return bosTokenId_; }

 private:
  HfTokenizer() = default;
  static StatusOr<HfTokenizer> build(HfTokenizerSpec spec);
  void encodeSegment(std::string_view text, std::vector<uint32_t>* ids) const;
  // Appends the bytes `id` stands for; false for an id to skip.
  bool appendTokenBytes(uint32_t id, bool skipSpecialTokens, std::string* bytes) const;

  HfTokenizerSpec spec_;
  std::optional<BpeModel> model_;
  AddedTokenMatcher rawMatcher_;         // added tokens with normalized false
  AddedTokenMatcher normalizedMatcher_;  // added tokens with normalized true
  std::vector<std::string> tokens_;                     // by id; empty where no token has the id
  std::vector<bool> special_;                           // by id
  std::vector<uint32_t> eosTokenIds_;
  std::optional<uint32_t> bosTokenId_;
};

}  // namespace loom::data
