#include "worker/torch/model/flops_report.h"

#include <algorithm>
#include <cmath>
#include <map>

#include <fmt/format.h>

#include "worker/monitor/monitor_event.h"  // pythonFloat

namespace loom::worker {

namespace {

// Python's `round(x, 2)` then `:g`.
std::string roundedG(double v) {
  const double r = std::nearbyint(v * 100.0) / 100.0;
  return fmt::format("{:g}", r == 0 ? 0.0 : r);
}

}  // namespace

std::string profilerNumber(double num) {
  double magnitude = 1;
  const char* units = "";
  if (num >= 1e12) {
    magnitude = 1e12, units = "T";
  } else if (num >= 1e9) {
    magnitude = 1e9, units = "G";
  } else if (num >= 1e6) {
    magnitude = 1e6, units = "M";
  } else if (num >= 1e3) {
    magnitude = 1e3, units = "K";
  } else if (num >= 1 || num == 0) {
    magnitude = 1, units = "";
  } else if (num >= 1e-3) {
    magnitude = 1e-3, units = "m";
  } else {
    magnitude = 1e-6, units = "u";
  }
  return roundedG(num / magnitude) + " " + units;
}

std::string profilerParams(double params) {
  std::string s = profilerNumber(params);
  std::replace(s.begin(), s.end(), 'G', 'B');
  while (!s.empty() && s.back() == ' ') s.pop_back();
  return s;
}

namespace {

std::string macsString(double macs) { return profilerNumber(macs) + "MACs"; }
std::string flopsString(double flops) { return profilerNumber(flops) + "FLOPS"; }
std::string durationString(double seconds) { return profilerNumber(seconds) + "s"; }
std::string percent(double part, double whole) { return whole ? roundedG(100 * part / whole) : "0"; }

// DeepSpeed's '{:<70}  {:<8}'.
std::string summaryLine(const std::string& label, const std::string& value) {
  return fmt::format("{:<70}  {:<8}\n", label, value);
}

// torch's Module.__repr__ with DeepSpeed's flops_repr as every module's extra_repr; a ModuleList
// folds runs of identical children into "(0-1): 2 x ...".
class TreePrinter {
 public:
  explicit TreePrinter(const FlopsProfile& p) : p_(p) {
    totalParams_ = static_cast<double>(p.modules()[0].params);
    totalMacs_ = static_cast<double>(p.totalMacs(0));
    totalSeconds_ = p.totalSeconds(0);
  }

  std::string repr(int index) const {
    const auto& m = p_.modules()[index];
    std::vector<std::string> children;
    if (m.className == "ModuleList") {
      const auto& kids = m.children;
      for (size_t i = 0; i < kids.size();) {
        const std::string body = repr(kids[i]);
        size_t j = i + 1;
        while (j < kids.size() && repr(kids[j]) == body) ++j;
        const std::string key = j - i == 1 ? "(" + p_.modules()[kids[i]].name + ")"
                                           : fmt::format("({}-{}): {} x", p_.modules()[kids[i]].name,
                                                         p_.modules()[kids[j - 1]].name, j - i);
        children.push_back(j - i == 1 ? key + ": " + indent(body) : key + " " + indent(body));
        i = j;
      }
      if (children.empty()) return m.className + "()";
      std::string out = m.className + "(\n";
      for (const auto& c : children) out += "  " + c + "\n";
      return out + ")";
    }
    for (int c : m.children) children.push_back("(" + p_.modules()[c].name + "): " + indent(repr(c)));
    const std::string extra = profileRepr(index);
    if (children.empty()) return m.className + "(" + extra + ")";
    std::string out = m.className + "(\n  " + indent(extra) + "\n";
    for (const auto& c : children) out += "  " + c + "\n";
    return out + ")";
  }

 private:
  std::string profileRepr(int index) const {
    const auto& m = p_.modules()[index];
    const double params = static_cast<double>(m.params), macs = static_cast<double>(p_.totalMacs(index));
    const double seconds = p_.totalSeconds(index), flops = static_cast<double>(p_.totalFlops(index));
    const double rate = seconds ? std::nearbyint(flops / seconds * 100) / 100 : 0;
    std::string out = fmt::format("{} = {}% Params, {} = {}% MACs, {} = {}% latency, {}", profilerParams(params),
                                  percent(params, totalParams_), macsString(macs), percent(macs, totalMacs_),
                                  durationString(seconds), percent(seconds, totalSeconds_), flopsString(rate));
    if (!m.extraRepr.empty()) out += ", " + m.extraRepr;
    return out;
  }

  // torch's _addindent(s, 2): every line but the first, two spaces in.
  static std::string indent(const std::string& s) {
    std::string out;
    for (char ch : s) {
      out += ch;
      if (ch == '\n') out += "  ";
    }
    return out;
  }

  const FlopsProfile& p_;
  double totalParams_ = 0, totalMacs_ = 0, totalSeconds_ = 0;
};

// A Python dict's repr of the top entries: {'LlamaMLP': '49.15 K', 'LlamaAttention': '24.58 K'}.
std::string topEntries(std::vector<std::pair<std::string, double>> entries, int top,
                       std::string (*format)(double)) {
  std::stable_sort(entries.begin(), entries.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
  std::string out = "{";
  for (int i = 0; i < std::min<int>(top, static_cast<int>(entries.size())); ++i)
    out += fmt::format("{}'{}': '{}'", i ? ", " : "", entries[i].first, format(entries[i].second));
  return out + "}";
}

std::string aggregated(const FlopsProfile& p, int moduleDepth, int topModules) {
  // depth -> class name -> (macs, params, seconds), classes in the order they are met
  std::vector<std::vector<std::pair<std::string, std::array<double, 3>>>> info;
  std::function<void(int, size_t)> walk = [&](int index, size_t depth) {
    if (info.size() <= depth) info.resize(depth + 1);
    const auto& m = p.modules()[index];
    auto& level = info[depth];
    auto it = std::find_if(level.begin(), level.end(), [&](const auto& e) { return e.first == m.className; });
    if (it == level.end()) it = level.insert(level.end(), {m.className, {0, 0, 0}});
    it->second[0] += static_cast<double>(p.totalMacs(index));
    it->second[1] += static_cast<double>(m.params);
    it->second[2] += p.totalSeconds(index);
    for (int c : m.children) walk(c, depth + 1);
  };
  walk(0, 0);
  const int depth = moduleDepth == -1 ? static_cast<int>(info.size()) - 1 : moduleDepth;
  std::string out = fmt::format("Top {} modules in terms of params, MACs or fwd latency at different model depths:\n",
                                topModules);
  for (int d = 0; d < depth && d < static_cast<int>(info.size()); ++d) {
    auto column = [&](int k) {
      std::vector<std::pair<std::string, double>> entries;
      for (const auto& [name, values] : info[d]) entries.emplace_back(name, values[k]);
      return entries;
    };
    out += fmt::format("depth {}:\n", d);
    out += "    params      - " + topEntries(column(1), topModules, profilerParams) + "\n";
    out += "    MACs        - " + topEntries(column(0), topModules, macsString) + "\n";
    out += "    fwd latency - " + topEntries(column(2), topModules, durationString) + "\n";
  }
  return out;
}

// Python's repr of round(x, 2): 290.45, 12.0.
std::string pythonRounded(double v) { return pythonFloat(std::nearbyint(v * 100) / 100); }

}  // namespace

std::string flopsProfileReport(const FlopsProfile& profile, const FlopsReportContext& c) {
  const double params = static_cast<double>(profile.modules()[0].params);
  const double macs = static_cast<double>(profile.totalMacs(0)), flops = static_cast<double>(profile.totalFlops(0));
  std::string out = "\n-------------------------- DeepSpeed Flops Profiler --------------------------\n";
  out += fmt::format("Profile Summary at step {}:\n", c.profileStep);
  out += "Notations:\n"
         "data parallel size (dp_size), model parallel size(mp_size),\n"
         "number of parameters (params), number of multiply-accumulate operations(MACs),\n"
         "number of floating-point operations (flops), floating-point operations per second (FLOPS),\n"
         "fwd latency (forward propagation latency), bwd latency (backward propagation latency),\n"
         "step (weights update latency), iter latency (sum of fwd, bwd and step latency)\n\n";
  out += summaryLine("world size: ", std::to_string(c.worldSize));
  out += summaryLine("data parallel size: ", std::to_string(c.dataParallelSize));
  out += summaryLine("model parallel size: ", std::to_string(c.modelParallelSize));
  out += summaryLine("batch size per GPU: ", std::to_string(c.microBatchSize));
  out += summaryLine("params per GPU: ", profilerParams(params));
  out += summaryLine("params of model = params per GPU * mp_size: ", profilerParams(params * c.modelParallelSize));
  out += summaryLine("fwd MACs per GPU: ", macsString(macs));
  out += summaryLine("fwd flops per GPU: ", profilerNumber(flops));
  out += summaryLine("fwd flops of model = fwd flops per GPU * mp_size: ", profilerNumber(flops * c.modelParallelSize));
  // With the profiler on, DeepSpeed's engine times every step: the forward, backward and step
  // latencies are its global timers'.
  const double fwd = c.forwardSeconds, bwd = c.backwardSeconds, step = c.stepSeconds;
  out += summaryLine("fwd latency: ", durationString(fwd));
  out += summaryLine("fwd FLOPS per GPU = fwd flops per GPU / fwd latency: ", flopsString(fwd ? flops / fwd : 0));
  const double factor = 2 + c.recomputeFwdFactor;
  out += summaryLine("bwd latency: ", durationString(bwd));
  out += summaryLine(fmt::format("bwd FLOPS per GPU = {:g} * fwd flops per GPU / bwd latency: ", factor),
                     flopsString(bwd ? factor * flops / bwd : 0));
  out += summaryLine(fmt::format("fwd+bwd FLOPS per GPU = {:g} * fwd flops per GPU / (fwd+bwd latency): ", factor + 1),
                     flopsString(fwd + bwd ? (factor + 1) * flops / (fwd + bwd) : 0));
  out += summaryLine("step latency: ", durationString(step));
  const double iter = fwd + bwd + step;
  out += summaryLine("iter latency: ", durationString(iter));
  out += summaryLine(fmt::format("FLOPS per GPU = {:g} * fwd flops per GPU / iter latency: ", factor + 1),
                     flopsString(iter ? (factor + 1) * flops / iter : 0));
  out += summaryLine("samples/second: ",
                     pythonRounded(iter ? static_cast<double>(c.microBatchSize * c.worldSize) / iter : 0));
  out += "\n----------------------------- Aggregated Profile per GPU -----------------------------\n";
  out += aggregated(profile, c.moduleDepth, c.topModules);
  if (c.detailed) {
    out += "\n------------------------------ Detailed Profile per GPU ------------------------------\n";
    out += "Each module profile is listed after its name in the following order: \n"
           "params, percentage of total params, MACs, percentage of total MACs, fwd latency, percentage of total fwd "
           "latency, fwd FLOPS\n";
    out += "\nNote: 1. A module can have torch.nn.module or torch.nn.functional to compute logits (e.g. "
           "CrossEntropyLoss). They are not counted as submodules, thus not to be printed out. However they make up "
           "the difference between a parent's MACs (or latency) and the sum of its submodules'.\n"
           "2. Number of floating-point operations is a theoretical estimation, thus FLOPS computed using that could "
           "be larger than the maximum system throughput.\n"
           "3. The fwd latency listed in the top module's profile is directly captured at the module forward "
           "function in PyTorch, thus it's less than the fwd latency shown above which is captured in DeepSpeed.\n\n";
    out += TreePrinter(profile).repr(0) + "\n";
  }
  out += "------------------------------------------------------------------------------\n";
  return out;
}

}  // namespace loom::worker
