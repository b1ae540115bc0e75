#include "planner/json_reader.h"

#include <cmath>

namespace loom::planner {

using nlohmann::json;

Status specProblems(const std::vector<std::string>& problems) {
  if (problems.empty()) return Status::ok();
  if (problems.size() == 1) return invalidArgument("{}", problems[0]);
  std::string list;
  for (const std::string& p : problems) list += "\n  " + p;
  return invalidArgument("{} problems:{}", problems.size(), list);
}

std::string jsonPath(const std::string& parent, const std::string& key) {
  return parent.empty() ? key : parent + "." + key;
}

const json* ObjectReader::find(const std::string& key) {
  seen_.insert(key);
  auto it = object_.find(key);
  return it == object_.end() ? nullptr : &*it;
}

Status ObjectReader::readString(const std::string& key, std::string* out, bool required) {
  const json* v = find(key);
  if (!v || v->is_null()) return required ? missing(key) : Status::ok();
  if (!v->is_string()) return wrongType(key, "a string", *v);
  *out = v->get<std::string>();
  return Status::ok();
}

Status ObjectReader::readInt(const std::string& key, int64_t* out, bool required, int64_t min, int64_t max) {
  const json* v = find(key);
  if (!v) return required ? missing(key) : Status::ok();
  if (!v->is_number_integer()) return wrongType(key, "an integer", *v);
  int64_t x = v->get<int64_t>();
  if (x < min || x > max) return invalidArgument("{}: must be between {} and {}, got {}", pathOf(key), min, max, x);
  *out = x;
  return Status::ok();
}

Status ObjectReader::readWholeNumber(const std::string& key, int64_t* out, bool required, int64_t min, int64_t max) {
  const json* v = find(key);
  if (!v) return required ? missing(key) : Status::ok();
  if (!v->is_number()) return wrongType(key, "a whole number", *v);
  double d = v->get<double>();
  if (std::floor(d) != d) return invalidArgument("{}: must be a whole number, got {}", pathOf(key), d);
  if (d < double(min) || d > double(max))
    return invalidArgument("{}: must be between {} and {}, got {}", pathOf(key), min, max, d);
  *out = v->is_number_integer() ? v->get<int64_t>() : static_cast<int64_t>(d);
  return Status::ok();
}

Status ObjectReader::readDouble(const std::string& key, double* out, bool required, double min, double max) {
  const json* v = find(key);
  if (!v) return required ? missing(key) : Status::ok();
  if (!v->is_number()) return wrongType(key, "a number", *v);
  double x = v->get<double>();
  if (!(x >= min && x <= max)) return invalidArgument("{}: must be between {} and {}, got {}", pathOf(key), min, max, x);
  *out = x;
  return Status::ok();
}

Status ObjectReader::readBool(const std::string& key, bool* out) {
  const json* v = find(key);
  if (!v) return Status::ok();
  if (!v->is_boolean()) return wrongType(key, "true or false", *v);
  *out = v->get<bool>();
  return Status::ok();
}

Status ObjectReader::readStrings(const std::string& key, std::vector<std::string>* out,
                                 const std::set<std::string>& allowed) {
  const json* v = find(key);
  if (!v) return Status::ok();
  if (!v->is_array()) return wrongType(key, "a list of strings", *v);
  out->clear();
  for (const auto& item : *v) {
    if (!item.is_string()) return wrongType(key, "a list of strings", item);
    std::string s = item.get<std::string>();
    if (!allowed.empty() && !allowed.count(s)) {
      std::string names;
      for (const auto& a : allowed) names += (names.empty() ? "" : ", ") + a;
      return invalidArgument("{}: \"{}\" is not one of {}", pathOf(key), s, names);
    }
    out->push_back(s);
  }
  return Status::ok();
}

Status ObjectReader::readDoubles(const std::string& key, std::vector<double>* out, size_t count) {
  const json* v = find(key);
  if (!v) return Status::ok();
  if (!v->is_array() || v->size() != count)
    return invalidArgument("{}: must be a list of {} numbers, got {}", pathOf(key), count, v->dump());
  out->clear();
  for (const auto& item : *v) {
    if (!item.is_number()) return invalidArgument("{}: must be a list of {} numbers, got {}", pathOf(key), count, v->dump());
    out->push_back(item.get<double>());
  }
  return Status::ok();
}

Status ObjectReader::readSeconds(const std::string& key, int64_t* outMs, double min, double max) {
  const json* v = find(key);
  if (!v) return Status::ok();
  if (!v->is_number()) return wrongType(key, "a number of seconds", *v);
  double s = v->get<double>();
  if (s < min || s > max)
    return invalidArgument("{}: must be between {} and {} seconds, got {}", pathOf(key), min, max, s);
  *outMs = static_cast<int64_t>(s * 1000.0);
  return Status::ok();
}

StatusOr<const json*> ObjectReader::readObject(const std::string& key) {
  const json* v = find(key);
  if (!v || v->is_null()) return static_cast<const json*>(nullptr);
  if (!v->is_object()) return wrongType(key, "an object", *v);
  return v;
}

Status ObjectReader::rejectUnknown() const {
  if (!object_.is_object()) return invalidArgument("{}: must be a JSON object", where_);
  for (auto it = object_.begin(); it != object_.end(); ++it) {
    if (!seen_.count(it.key())) return invalidArgument("{}: unknown key", pathOf(it.key()));
  }
  return Status::ok();
}

Status ObjectReader::missing(const std::string& key) const {
  return invalidArgument("{}: required field is missing", pathOf(key));
}

Status ObjectReader::wrongType(const std::string& key, const char* want, const json& got) const {
  return invalidArgument("{}: must be {}, got {}", pathOf(key), want, got.type_name());
}

}  // namespace loom::planner
