#include "client/loomctl/commands.h"

#include <cstdio>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace loom::loomctl {

int dataPrepareCommand(const GlobalOptions& g, const data::PrepareOptions& options) {
  auto header = data::prepareTokenFile(options);
  if (!header.isOk()) return reportError(header.status());
  const size_t documents = header->documentStarts.size();
  if (g.format == OutputFormat::kJson) {
    nlohmann::ordered_json j;
    j["output"] = options.output;
    j["documents"] = documents;
    j["tokens"] = header->numTokens;
    j["vocab_size"] = header->vocabSize;
    j["dtype"] = header->dtype;
    j["tokenizer"] = header->tokenizer;
    j["eos_token_id"] = header->eosTokenId;
    std::puts(j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
  } else {
    std::puts(fmt::format("{} documents, {} tokens, vocab size {} ({} tokenizer) -> {}", documents,
                          header->numTokens, header->vocabSize, header->tokenizer, options.output)
                  .c_str());
  }
  return 0;
}

}  // namespace loom::loomctl
