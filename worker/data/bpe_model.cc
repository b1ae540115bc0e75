#include "worker/data/bpe_model.h"

#include <mutex>
#include <queue>

#include "worker/data/utf8.h"

namespace loom::data {

namespace {

uint64_t pairKey(uint32_t left, uint32_t right) { return (uint64_t{left} << 32) | right; }

// As in `tokenizers`: words longer than this are not cached, and a full cache takes no more.
constexpr size_t kCacheCapacity = 1 << 16;
constexpr size_t kMaxCachedWordBytes = 256;

}  // namespace

struct BpeModel::Cache {
  std::mutex mutex;
  std::unordered_map<std::string, std::vector<uint32_t>> words;
};

BpeModel::BpeModel(BpeModel&&) noexcept = default;
BpeModel& BpeModel::operator=(BpeModel&&) noexcept = default;
BpeModel::~BpeModel() = default;

StatusOr<BpeModel> BpeModel::create(std::unordered_map<std::string, uint32_t> vocab, const std::vector<Merge>& merges,
                                    bool ignoreMerges) {
  BpeModel model;
  for (const auto& [token, id] : vocab) {
    size_t pos = 0;
    const char32_t c = utf8::decodeNext(token, &pos);
    if (pos == token.size() && !token.empty()) model.charIds_[c] = id;
  }
  auto idOf = [&](size_t rank, const std::string& token) -> StatusOr<uint32_t> {
    auto it = vocab.find(token);
    if (it == vocab.end()) return invalidArgument("merges[{}]: \"{}\" is not in the vocab", rank, token);
    return it->second;
  };
  model.merges_.reserve(merges.size());
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    ASSIGN_OR_RETURN(uint32_t left, idOf(rank, merges[rank].left));
    ASSIGN_OR_RETURN(uint32_t right, idOf(rank, merges[rank].right));
    ASSIGN_OR_RETURN(uint32_t merged, idOf(rank, merges[rank].left + merges[rank].right));
    model.merges_[pairKey(left, right)] = {static_cast<uint32_t>(rank), merged};
  }
  model.vocab_ = std::move(vocab);
  model.ignoreMerges_ = ignoreMerges;
  model.cache_ = std::make_unique<Cache>();
  return model;
}

void BpeModel::tokenize(std::string_view word, std::vector<uint32_t>* out) const {
  if (word.empty()) return;
  if (ignoreMerges_) {
    auto it = vocab_.find(std::string(word));
    if (it != vocab_.end()) {
      out->push_back(it->second);
      return;
    }
  }
  const bool cacheable = word.size() <= kMaxCachedWordBytes;
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_->mutex);
    auto it = cache_->words.find(std::string(word));
    if (it != cache_->words.end()) {
      out->insert(out->end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<uint32_t> ids;
  merge(word, &ids);
  out->insert(out->end(), ids.begin(), ids.end());
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_->mutex);
    if (cache_->words.size() < kCacheCapacity) cache_->words.emplace(word, std::move(ids));
  }
}

// Word::merge_all of `tokenizers`: a queue of the pairs that have a merge, lowest rank first and
// leftmost among equals; a queued pair that an earlier merge changed is skipped when it comes up.
void BpeModel::merge(std::string_view word, std::vector<uint32_t>* out) const {
  struct Symbol {
    uint32_t id;
    int prev;
    int next;
    bool removed;
  };
  std::vector<Symbol> symbols;
  for (size_t pos = 0; pos < word.size();) {
    auto it = charIds_.find(utf8::decodeNext(word, &pos));
    if (it == charIds_.end()) continue;
    const int index = static_cast<int>(symbols.size());
    symbols.push_back({it->second, index - 1, index + 1, false});
  }
  if (symbols.empty()) return;
  symbols.back().next = -1;

  struct Candidate {
    uint32_t rank;
    int pos;
    uint32_t id;
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> queue;
  auto push = [&](int left) {
    const int right = symbols[left].next;
    if (right < 0) return;
    auto it = merges_.find(pairKey(symbols[left].id, symbols[right].id));
    if (it != merges_.end()) queue.push({it->second.rank, left, it->second.id});
  };
  for (int i = 0; i + 1 < static_cast<int>(symbols.size()); ++i) push(i);

  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    Symbol& left = symbols[top.pos];
    if (left.removed || left.next < 0) continue;
    const int rightIndex = left.next;
    auto it = merges_.find(pairKey(left.id, symbols[rightIndex].id));
    if (it == merges_.end() || it->second.id != top.id) continue;  // stale: the pair has changed
    left.id = top.id;
    symbols[rightIndex].removed = true;
    left.next = symbols[rightIndex].next;
    if (left.next >= 0) symbols[left.next].prev = top.pos;
    if (left.prev >= 0) push(left.prev);
    push(top.pos);
  }
  for (const Symbol& s : symbols)
    if (!s.removed) out->push_back(s.id);
}

}  // namespace loom::data
