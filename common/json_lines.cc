#include "common/json_lines.h"

#include <fmt/format.h>

#include "common/files.h"

namespace loom {

Status forEachJsonLine(const std::string& path, const std::string& field,
                       const std::function<Status(const nlohmann::json&, int64_t)>& line) {
  auto text = files::readFile(path);
  if (!text.isOk()) return text.status().withContext(field);
  size_t begin = 0;
  for (int64_t number = 1; begin < text->size(); ++number) {
    size_t end = text->find('\n', begin);
    if (end == std::string::npos) end = text->size();
    const std::string_view raw(text->data() + begin, end - begin);
    begin = end + 1;
    if (raw.find_first_not_of(" \t\r") == std::string_view::npos) continue;
    auto where = [&](const Status& s) { return s.withContext(fmt::format("{}: {} line {}", field, path, number)); };
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(raw);
    } catch (const nlohmann::json::exception& e) {  // a parse error, or out_of_range: a number too large
      return where(invalidArgument("not valid JSON: {}", e.what()));
    }
    if (Status s = line(j, number); !s.isOk()) return where(s);
  }
  return Status::ok();
}

}  // namespace loom
