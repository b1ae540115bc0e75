#include "worker/data/added_tokens.h"

#include <algorithm>

#include "worker/data/unicode_classes.h"
#include "worker/data/utf8.h"

namespace loom::data {

namespace {

// White space as lstrip and rstrip see it: Rust's char::is_whitespace, the White_Space property.
bool spaceAt(std::string_view text, size_t* pos) {
  return unicode::isSpace(unicode::charClassOf(utf8::decodeNext(text, pos)));
}

// Where the white space that ends text[from, to) starts; `to` when there is none.
size_t spaceStartBefore(std::string_view text, size_t from, size_t to) {
  size_t runStart = to;
  for (size_t pos = from; pos < to;) {
    const size_t at = pos;
    if (!spaceAt(text, &pos)) {
      runStart = to;
    } else if (runStart == to) {
      runStart = at;
    }
  }
  return runStart;
}

// Where the white space that starts at text[from] ends.
size_t spaceEndAfter(std::string_view text, size_t from) {
  size_t pos = from;
  for (size_t next = pos; pos < text.size() && spaceAt(text, &next); pos = next) {
  }
  return pos;
}

}  // namespace

AddedTokenMatcher::AddedTokenMatcher(std::vector<Entry> entries) : entries_(std::move(entries)) {
  std::stable_sort(entries_.begin(), entries_.end(),
                   [](const Entry& a, const Entry& b) { return a.matchedText.size() > b.matchedText.size(); });
  for (const Entry& e : entries_) firstBytes_[static_cast<unsigned char>(e.matchedText[0])] = true;
}

const AddedTokenMatcher::Entry* AddedTokenMatcher::longestAt(std::string_view text, size_t pos) const {
  if (!firstBytes_[static_cast<unsigned char>(text[pos])]) return nullptr;
  for (const Entry& e : entries_)
    if (text.compare(pos, e.matchedText.size(), e.matchedText) == 0) return &e;
  return nullptr;
}

std::vector<AddedTokenMatcher::Piece> AddedTokenMatcher::split(std::string_view text) const {
  std::vector<Piece> pieces;
  size_t done = 0;  // text before this is in pieces
  for (size_t pos = 0; pos < text.size();) {
    const Entry* e = longestAt(text, pos);
    if (e == nullptr) {
      ++pos;
      continue;
    }
    size_t start = pos;
    size_t stop = pos + e->matchedText.size();
    if (e->token.lstrip) start = spaceStartBefore(text, done, start);
    if (e->token.rstrip) stop = spaceEndAfter(text, stop);
    if (done < start) pieces.push_back({text.substr(done, start - done), nullptr});
    pieces.push_back({text.substr(start, stop - start), &e->token});
    pos = done = stop;
  }
  if (done < text.size()) pieces.push_back({text.substr(done), nullptr});
  return pieces;
}

}  // namespace loom::data
