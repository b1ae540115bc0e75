#pragma once

#include <string>
#include <vector>

#include "common/status.h"
#include "worker/data/token_file.h"

namespace loom::data {

struct PrepareOptions {
  std::vector<std::string> inputs;  // files, read in this order
  std::string output;               // the token file to write
  // "text", "jsonl", or "auto": jsonl for names ending .jsonl or .json-lines, text otherwise
  // (decided per input).
  std::string format = "auto";
  std::string textKey = "text";  // jsonl: the key of each line's document text
  // text: a line equal to this (ignoring a trailing \r) ends a document and is dropped, as "%" in
  // fortune files; empty: each input file is one document.
  std::string separator;
  // A Hugging Face tokenizer directory (tokenizer.json, and tokenizer_config.json or
  // generation_config.json naming the eos token); empty: the byte tokenizer.
  std::string tokenizer;

  Status validate() const;
};

// Tokenizes the inputs, each document followed by its end-of-document token, and writes them as
// one token file (documents in input order). With a Hugging Face tokenizer a document is encoded
// as `tokenizers`' encode(text, add_special_tokens=False) and ends with the tokenizer's first eos
// id; the header's tokenizer is "hf:" and the directory's absolute path. A document that is empty
// or only whitespace is skipped. Returns the header written. Errors name the file, and for jsonl
// the line and the key.
StatusOr<TokenFileHeader> prepareTokenFile(const PrepareOptions& options);

}  // namespace loom::data
