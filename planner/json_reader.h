#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace loom::planner {

// "deepspeed.optimizer" + "params" -> "deepspeed.optimizer.params"
std::string jsonPath(const std::string& parent, const std::string& key);

// One INVALID_ARGUMENT for every problem found in a spec, one per line ("3 problems:\n  ..."),
// or the message itself when there is one; OK when there is none.
Status specProblems(const std::vector<std::string>& problems);

// Reads the fields of one JSON object of a spec, remembering which keys were consumed so that
// anything left over is reported as unknown. Every error names the field by its JSON path.
class ObjectReader {
 public:
  ObjectReader(const nlohmann::json& object, std::string where) : object_(object), where_(std::move(where)) {}

  const nlohmann::json* find(const std::string& key);
  Status readString(const std::string& key, std::string* out, bool required);
  Status readInt(const std::string& key, int64_t* out, bool required, int64_t min, int64_t max);
  // Integers written as floats (DeepSpeed configs say 5e8) are accepted when they are whole.
  Status readWholeNumber(const std::string& key, int64_t* out, bool required, int64_t min, int64_t max);
  Status readDouble(const std::string& key, double* out, bool required, double min, double max);
  Status readBool(const std::string& key, bool* out);
  Status readStrings(const std::string& key, std::vector<std::string>* out, const std::set<std::string>& allowed);
  Status readDoubles(const std::string& key, std::vector<double>* out, size_t count);
  Status readSeconds(const std::string& key, int64_t* outMs, double min, double max);
  // An optional nested object; nullptr when absent.
  StatusOr<const nlohmann::json*> readObject(const std::string& key);
  Status rejectUnknown() const;

  std::string pathOf(const std::string& key) const { return jsonPath(where_, key); }

 private:
  Status missing(const std::string& key) const;
  Status wrongType(const std::string& key, const char* want, const nlohmann::json& got) const;

  const nlohmann::json& object_;
  std::string where_;
  std::set<std::string> seen_;
};

}  // namespace loom::planner
