#include "planner/job_spec.h"

#include <map>
#include <set>

namespace loom::planner {

using nlohmann::json;

const char* jobKindName(JobKind kind) {
  switch (kind) {
    case JobKind::kProbe: return "probe";
  }
  return "?";
}

const char* deviceKindName(DeviceKind device) {
  return device == DeviceKind::kCuda ? "cuda" : "cpu";
}

namespace {

const char* typeName(const json& v) { return v.type_name(); }

std::string path(const std::string& parent, const std::string& key) {
  return parent.empty() ? key : parent + "." + key;
}

// Reads the fields of one JSON object, remembering which keys were consumed so that anything
// left over is reported as unknown.
class ObjectReader {
 public:
  ObjectReader(const json& object, std::string where) : object_(object), where_(std::move(where)) {}

  const json* find(const std::string& key) {
    seen_.insert(key);
    auto it = object_.find(key);
    return it == object_.end() ? nullptr : &*it;
  }

  Status readString(const std::string& key, std::string* out, bool required) {
    const json* v = find(key);
    if (!v) return required ? missing(key) : Status::ok();
    if (!v->is_string()) return wrongType(key, "a string", *v);
    *out = v->get<std::string>();
    return Status::ok();
  }

  Status readInt(const std::string& key, int64_t* out, bool required, int64_t min, int64_t max) {
    const json* v = find(key);
    if (!v) return required ? missing(key) : Status::ok();
    if (!v->is_number_integer()) return wrongType(key, "an integer", *v);
    int64_t x = v->get<int64_t>();
    if (x < min || x > max)
      return invalidArgument("{}: must be between {} and {}, got {}", path(where_, key), min, max, x);
    *out = x;
    return Status::ok();
  }

  Status readBool(const std::string& key, bool* out) {
    const json* v = find(key);
    if (!v) return Status::ok();
    if (!v->is_boolean()) return wrongType(key, "true or false", *v);
    *out = v->get<bool>();
    return Status::ok();
  }

  Status readStrings(const std::string& key, std::vector<std::string>* out, const std::set<std::string>& allowed) {
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
        return invalidArgument("{}: \"{}\" is not one of {}", path(where_, key), s, names);
      }
      out->push_back(s);
    }
    return Status::ok();
  }

  Status readSeconds(const std::string& key, int64_t* outMs, double min, double max) {
    const json* v = find(key);
    if (!v) return Status::ok();
    if (!v->is_number()) return wrongType(key, "a number of seconds", *v);
    double s = v->get<double>();
    if (s < min || s > max)
      return invalidArgument("{}: must be between {} and {} seconds, got {}", path(where_, key), min, max, s);
    *outMs = static_cast<int64_t>(s * 1000.0);
    return Status::ok();
  }

  // An optional nested object; returns nullptr when absent.
  StatusOr<const json*> readObject(const std::string& key) {
    const json* v = find(key);
    if (!v) return static_cast<const json*>(nullptr);
    if (!v->is_object()) return wrongType(key, "an object", *v);
    return v;
  }

  Status rejectUnknown() const {
    for (auto it = object_.begin(); it != object_.end(); ++it) {
      if (!seen_.count(it.key()))
        return invalidArgument("{}: unknown key", path(where_, it.key()));
    }
    return Status::ok();
  }

  std::string pathOf(const std::string& key) const { return path(where_, key); }

 private:
  Status missing(const std::string& key) const {
    return invalidArgument("{}: required field is missing", path(where_, key));
  }
  Status wrongType(const std::string& key, const char* want, const json& got) const {
    return invalidArgument("{}: must be {}, got {}", path(where_, key), want, typeName(got));
  }

  const json& object_;
  std::string where_;
  std::set<std::string> seen_;
};

Status parseResources(const json& object, JobSpec* spec) {
  ObjectReader r(object, "resources");
  int64_t ranks = 0;
  RETURN_IF_ERROR(r.readInt("ranks", &ranks, /*required=*/true, 1, 65536));
  spec->ranks = static_cast<int>(ranks);
  std::string device = "cpu";
  RETURN_IF_ERROR(r.readString("device", &device, false));
  if (device == "cpu") {
    spec->device = DeviceKind::kCpu;
  } else if (device == "cuda") {
    spec->device = DeviceKind::kCuda;
  } else {
    return invalidArgument("resources.device: must be \"cpu\" or \"cuda\", got \"{}\"", device);
  }
  return r.rejectUnknown();
}

const std::set<std::string> kCollectiveOps{"all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast"};

Status parseCollectives(const json& object, CollectivesSpec* c) {
  ObjectReader r(object, "probe.collectives");
  RETURN_IF_ERROR(r.readStrings("ops", &c->ops, kCollectiveOps));
  int64_t iterations = c->iterations, warmup = c->warmup;
  RETURN_IF_ERROR(r.readInt("min_bytes", &c->minBytes, false, 1, int64_t(1) << 34));
  RETURN_IF_ERROR(r.readInt("max_bytes", &c->maxBytes, false, 1, int64_t(1) << 34));
  RETURN_IF_ERROR(r.readInt("iterations", &iterations, false, 1, 100'000));
  RETURN_IF_ERROR(r.readInt("warmup", &warmup, false, 0, 100'000));
  RETURN_IF_ERROR(r.readString("dtype", &c->dtype, false));
  static const std::set<std::string> kDtypes{"float32", "bfloat16", "float16", "int64"};
  if (!kDtypes.count(c->dtype))
    return invalidArgument("probe.collectives.dtype: must be float32, bfloat16, float16 or int64, got \"{}\"", c->dtype);
  if (c->minBytes > c->maxBytes)
    return invalidArgument("probe.collectives.min_bytes: {} is above max_bytes {}", c->minBytes, c->maxBytes);
  if (c->ops.empty()) return invalidArgument("probe.collectives.ops: must name at least one op");
  c->iterations = static_cast<int>(iterations);
  c->warmup = static_cast<int>(warmup);
  return r.rejectUnknown();
}

Status parseProbe(const json& object, JobSpec* spec) {
  ObjectReader r(object, "probe");
  int64_t ticks = spec->probe.ticks, tickMs = spec->probe.tickMs;
  RETURN_IF_ERROR(r.readInt("ticks", &ticks, false, 0, 1'000'000));
  RETURN_IF_ERROR(r.readInt("tick_ms", &tickMs, false, 0, 3'600'000));
  spec->probe.ticks = static_cast<int>(ticks);
  spec->probe.tickMs = static_cast<int>(tickMs);
  ASSIGN_OR_RETURN(const json* collectives, r.readObject("collectives"));
  if (collectives) {
    spec->probe.collectives.emplace();
    RETURN_IF_ERROR(parseCollectives(*collectives, &*spec->probe.collectives));
  }
  return r.rejectUnknown();
}

// The DeepSpeed config, verbatim. Only the sections this version acts on are accepted; any
// other key is refused by name rather than ignored.
Status parseDeepSpeed(const json& object, JobSpec* spec) {
  ObjectReader r(object, "deepspeed");
  ASSIGN_OR_RETURN(const json* logger, r.readObject("comms_logger"));
  if (logger) {
    ObjectReader l(*logger, "deepspeed.comms_logger");
    RETURN_IF_ERROR(l.readBool("enabled", &spec->commsLogger.enabled));
    RETURN_IF_ERROR(l.readBool("verbose", &spec->commsLogger.verbose));
    RETURN_IF_ERROR(l.readBool("prof_all", &spec->commsLogger.profAll));
    bool debug = false;  // DeepSpeed's caller-name tracing; accepted, it changes nothing here
    RETURN_IF_ERROR(l.readBool("debug", &debug));
    // DeepSpeed's op names, and what Loom calls the same operation.
    static const std::map<std::string, std::string> kOpNames{
        {"all_reduce", "all_reduce"},         {"all_gather", "all_gather"},
        {"all_gather_into_tensor", "all_gather"}, {"all_gather_base", "all_gather"},
        {"reduce_scatter", "reduce_scatter"}, {"reduce_scatter_tensor", "reduce_scatter"},
        {"reduce_scatter_base", "reduce_scatter"}, {"all_to_all", "all_to_all"},
        {"all_to_all_single", "all_to_all"},  {"broadcast", "broadcast"},
        {"send", "send"},                     {"recv", "recv"},
        {"barrier", "barrier"}};
    std::set<std::string> known;
    for (const auto& [name, ours] : kOpNames) known.insert(name);
    std::vector<std::string> ops;
    RETURN_IF_ERROR(l.readStrings("prof_ops", &ops, known));
    spec->commsLogger.profOps.clear();
    for (const auto& op : ops) spec->commsLogger.profOps.push_back(kOpNames.at(op));
    RETURN_IF_ERROR(l.rejectUnknown());
  }
  for (auto it = object.begin(); it != object.end(); ++it) {
    if (it.key() != "comms_logger")
      return invalidArgument("deepspeed.{}: not supported by this version (supported: comms_logger)", it.key());
  }
  return Status::ok();
}

Status parseRestart(const json& object, JobSpec* spec) {
  ObjectReader r(object, "restart");
  int64_t maxRestarts = spec->maxRestarts;
  RETURN_IF_ERROR(r.readInt("max_restarts", &maxRestarts, false, 0, 1000));
  spec->maxRestarts = static_cast<int>(maxRestarts);
  return r.rejectUnknown();
}

Status parseTimeouts(const json& object, JobSpec* spec) {
  ObjectReader r(object, "timeouts");
  RETURN_IF_ERROR(r.readSeconds("grace_period_s", &spec->gracePeriodMs, 0, 3600));
  RETURN_IF_ERROR(r.readSeconds("heartbeat_timeout_s", &spec->heartbeatTimeoutMs, 0.5, 86400));
  RETURN_IF_ERROR(r.readSeconds("rendezvous_s", &spec->rendezvousTimeoutMs, 0.5, 86400));
  RETURN_IF_ERROR(r.readSeconds("collective_s", &spec->collectiveTimeoutMs, 0.5, 86400));
  return r.rejectUnknown();
}

}  // namespace

StatusOr<JobSpec> parseJobSpec(const std::string& specJson) {
  json root;
  try {
    root = json::parse(specJson);
  } catch (const json::parse_error& e) {
    return invalidArgument("spec is not valid JSON: {}", e.what());
  }
  if (!root.is_object()) return invalidArgument("spec: must be a JSON object, got {}", root.type_name());

  JobSpec spec;
  ObjectReader r(root, "");
  RETURN_IF_ERROR(r.readString("name", &spec.name, /*required=*/true));
  if (spec.name.empty() || spec.name.size() > 63)
    return invalidArgument("name: must be 1 to 63 characters, got {}", spec.name.size());
  for (char c : spec.name) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_' && c != '.')
      return invalidArgument("name: may hold letters, digits, '-', '_' and '.' only, got \"{}\"", spec.name);
  }

  std::string kind;
  RETURN_IF_ERROR(r.readString("kind", &kind, true));
  if (kind == "probe") {
    spec.kind = JobKind::kProbe;
  } else {
    return invalidArgument("kind: \"{}\" is not a job kind this version runs (supported: probe)", kind);
  }

  ASSIGN_OR_RETURN(const json* resources, r.readObject("resources"));
  if (!resources) return invalidArgument("resources: required field is missing");
  RETURN_IF_ERROR(parseResources(*resources, &spec));

  ASSIGN_OR_RETURN(const json* probe, r.readObject("probe"));
  if (probe) RETURN_IF_ERROR(parseProbe(*probe, &spec));
  ASSIGN_OR_RETURN(const json* restart, r.readObject("restart"));
  if (restart) RETURN_IF_ERROR(parseRestart(*restart, &spec));
  ASSIGN_OR_RETURN(const json* timeouts, r.readObject("timeouts"));
  if (timeouts) RETURN_IF_ERROR(parseTimeouts(*timeouts, &spec));
  ASSIGN_OR_RETURN(const json* deepspeed, r.readObject("deepspeed"));
  if (deepspeed) RETURN_IF_ERROR(parseDeepSpeed(*deepspeed, &spec));

  RETURN_IF_ERROR(r.rejectUnknown());
  return spec;
}

json JobSpec::toJson() const {
  json probeJson{{"ticks", probe.ticks}, {"tick_ms", probe.tickMs}};
  if (probe.collectives) {
    const auto& c = *probe.collectives;
    probeJson["collectives"] = {{"ops", c.ops},           {"min_bytes", c.minBytes}, {"max_bytes", c.maxBytes},
                                {"iterations", c.iterations}, {"warmup", c.warmup},      {"dtype", c.dtype}};
  }
  return json{
      {"name", name},
      {"kind", jobKindName(kind)},
      {"resources", {{"ranks", ranks}, {"device", deviceKindName(device)}}},
      {"probe", probeJson},
      {"restart", {{"max_restarts", maxRestarts}}},
      {"timeouts",
       {{"grace_period_s", gracePeriodMs / 1000.0},
        {"heartbeat_timeout_s", heartbeatTimeoutMs / 1000.0},
        {"rendezvous_s", rendezvousTimeoutMs / 1000.0},
        {"collective_s", collectiveTimeoutMs / 1000.0}}},
      {"deepspeed",
       {{"comms_logger",
         {{"enabled", commsLogger.enabled},
          {"verbose", commsLogger.verbose},
          {"prof_all", commsLogger.profAll},
          {"prof_ops", commsLogger.profOps}}}}},
  };
}

}  // namespace loom::planner
