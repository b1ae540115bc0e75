#include "worker/data/hf_tokenizer.h"

#include <algorithm>
#include <unordered_map>

#include "worker/data/byte_level.h"
#include "worker/data/unicode_nfc.h"
#include "worker/data/utf8.h"

namespace loom::data {

namespace {

// `tokenizers` does not take an added token's id from the file: in file order, a token already in
// the vocabulary (or added before) keeps that id, and any other takes the next one after the
// vocabulary's size and the added ids so far (warning when the file said otherwise). A file that
// disagrees with it is refused, so that Loom's ids are always the package's.
Status checkAddedTokenIds(const HfTokenizerSpec& spec) {
  std::unordered_map<std::string_view, uint32_t> added;
  uint64_t next = spec.vocab.size();
  for (size_t i = 0; i < spec.addedTokens.size(); ++i) {
    const AddedToken& a = spec.addedTokens[i];
    uint64_t expected = next;
    if (auto it = added.find(a.content); it != added.end()) {
      expected = it->second;
    } else if (auto v = spec.vocab.find(a.content); v != spec.vocab.end()) {
      expected = v->second;
    }
    if (a.id != expected)
      return invalidArgument(
          "added_tokens[{}].id: {} for \"{}\", but the tokenizers package gives it {} (a token not in the vocabulary "
          "takes the next id after the vocabulary and the added tokens before it)",
          i, a.id, a.content, expected);
    added.emplace(a.content, a.id);
    next = std::max<uint64_t>(next, uint64_t{a.id} + 1);
  }
  return Status::ok();
}

}  // namespace

StatusOr<HfTokenizer> HfTokenizer::build(HfTokenizerSpec spec) {
  if (spec.vocab.empty()) return invalidArgument("model.vocab: must not be empty");
  RETURN_IF_ERROR(checkAddedTokenIds(spec));
  HfTokenizer t;
  uint32_t maxId = 0;
  for (const auto& [token, id] : spec.vocab) maxId = std::max(maxId, id);
  for (const AddedToken& a : spec.addedTokens) maxId = std::max(maxId, a.id);
  t.tokens_.resize(size_t{maxId} + 1);
  t.special_.resize(size_t{maxId} + 1);
  for (const auto& [token, id] : spec.vocab) t.tokens_[id] = token;
  // As in `tokenizers`, an added token wins over a vocabulary entry of the same id, and one matched
  // in normalized text decodes as its normalized content too.
  std::vector<AddedTokenMatcher::Entry> raw, normalized;
  for (const AddedToken& a : spec.addedTokens) {
    std::string text = a.normalized && spec.nfc ? unicode::toNfc(a.content) : a.content;
    t.tokens_[a.id] = text;
    t.special_[a.id] = a.special;
    (a.normalized ? normalized : raw).push_back({a, std::move(text)});
  }
  t.rawMatcher_ = AddedTokenMatcher(std::move(raw));
  t.normalizedMatcher_ = AddedTokenMatcher(std::move(normalized));
  auto model = BpeModel::create(std::move(spec.vocab), spec.merges, spec.ignoreMerges);
  if (!model.isOk()) return Status(model.status().code(), "model." + model.status().message());
  t.model_.emplace(std::move(model).value());
  spec.vocab.clear();  // moved into the model
  spec.merges.clear();
  t.spec_ = std::move(spec);
  return t;
}

StatusOr<HfTokenizer> HfTokenizer::fromJson(std::string_view tokenizerJson, const std::string& origin) {
  auto spec = parseTokenizerJson(tokenizerJson);
  if (!spec.isOk()) return spec.status().withContext(origin);
  auto tokenizer = build(std::move(spec).value());
  if (!tokenizer.isOk()) return tokenizer.status().withContext(origin);
  return tokenizer;
}

// Text between added tokens, normalized: the Split patterns, then ByteLevel, then BPE per piece.
void HfTokenizer::encodeSegment(std::string_view text, std::vector<uint32_t>* ids) const {
  std::vector<std::string_view> pieces{text};
  for (SplitPattern pattern : spec_.splits) {
    std::vector<std::string_view> next;
    for (std::string_view piece : pieces) {
      auto split = splitIsolated(piece, pattern);
      next.insert(next.end(), split.begin(), split.end());
    }
    pieces = std::move(next);
  }
  std::string prefixed;
  for (std::string_view piece : pieces) {
    if (spec_.addPrefixSpace && piece.front() != ' ') {
      prefixed = " " + std::string(piece);
      piece = prefixed;
    }
    if (!spec_.byteLevelSplit) {
      model_->tokenize(toByteLevel(piece), ids);
      continue;
    }
    for (std::string_view word : splitIsolated(piece, SplitPattern::kGpt2)) model_->tokenize(toByteLevel(word), ids);
  }
}

std::vector<uint32_t> HfTokenizer::encode(std::string_view text, const EncodeOptions& options) const {
  std::vector<uint32_t> ids;
  ids.reserve(text.size() / 3);
  // As `tokenizers`: added tokens that match the raw text first, then each stretch between them
  // normalized on its own, then the added tokens that match normalized text.
  for (const auto& piece : rawMatcher_.split(text)) {
    if (piece.token != nullptr) {
      ids.push_back(piece.token->id);
      continue;
    }
    const std::string normalized = spec_.nfc ? unicode::toNfc(piece.text) : std::string(piece.text);
    for (const auto& inner : normalizedMatcher_.split(normalized)) {
      if (inner.token != nullptr) {
        ids.push_back(inner.token->id);
      } else {
        encodeSegment(inner.text, &ids);
      }
    }
  }
  if (!options.addSpecialTokens || spec_.singleTemplate.empty()) return ids;
  std::vector<uint32_t> templated;
  templated.reserve(ids.size() + spec_.singleTemplate.size());
  for (const auto& item : spec_.singleTemplate) {
    const auto& from = item.isText ? ids : item.ids;
    templated.insert(templated.end(), from.begin(), from.end());
  }
  return templated;
}

bool HfTokenizer::appendTokenBytes(uint32_t id, bool skipSpecialTokens, std::string* bytes) const {
  if (id >= tokens_.size() || tokens_[id].empty()) return false;
  if (skipSpecialTokens && special_[id]) return false;
  // ByteLevel's decoder: a token whose characters are not all byte-level ones (an added token
  // such as "<｜end｜>") stands for its own UTF-8.
  if (!appendFromByteLevel(tokens_[id], bytes)) *bytes += tokens_[id];
  return true;
}

std::string HfTokenizer::decode(std::span<const uint32_t> ids, bool skipSpecialTokens) const {
  std::string bytes;
  for (uint32_t id : ids) appendTokenBytes(id, skipSpecialTokens, &bytes);
  return utf8::toValidLossy(bytes);
}

DecodedText HfTokenizer::decodeIncrementally(std::span<const uint32_t> ids, size_t emittedTokens,
                                             bool skipSpecialTokens, bool final) const {
  emittedTokens = std::min(emittedTokens, ids.size());
  std::string bytes;
  // The byte offset after each token, to cut at the last one that ends a whole character.
  std::vector<size_t> ends;
  ends.reserve(ids.size() - emittedTokens);
  for (size_t i = emittedTokens; i < ids.size(); ++i) {
    appendTokenBytes(ids[i], skipSpecialTokens, &bytes);
    ends.push_back(bytes.size());
  }
  if (final) return {utf8::toValidLossy(bytes), ids.size()};
  for (size_t k = ends.size(); k > 0; --k) {
    const std::string_view prefix(bytes.data(), ends[k - 1]);
    if (utf8::incompleteTailLength(prefix) == 0) return {utf8::toValidLossy(prefix), emittedTokens + k};
  }
  return {"", emittedTokens};
}

std::optional<uint32_t> HfTokenizer::tokenId(std::string_view token) const {
  for (const AddedToken& a : spec_.addedTokens)
    if (a.content == token) return a.id;
  auto it = model_->vocab().find(std::string(token));
  if (it == model_->vocab().end()) return std::nullopt;
  return it->second;
}

}  // namespace loom::data
