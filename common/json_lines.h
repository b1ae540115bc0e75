#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace loom {

// Reads a JSONL file and calls `line` with each line's JSON and its number (from 1); blank lines
// are skipped. A file that cannot be read, a line that is not JSON, and an error `line` returns
// stop the reading, named as "<field>: <path> line <n>" (the spec field that gave the path).
Status forEachJsonLine(const std::string& path, const std::string& field,
                       const std::function<Status(const nlohmann::json&, int64_t)>& line);

}  // namespace loom
