#include "common/prometheus_text.h"

#include <cmath>

#include <fmt/format.h>

namespace loom {

namespace {

std::string number(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  return fmt::format("{}", v);  // the shortest text that reads back as v
}

std::string escaped(const std::string& s, bool quote) {
  std::string out;
  for (char c : s) {
    if (c == '\\') out += "\\\\";
    else if (c == '\n') out += "\\n";
    else if (quote && c == '"') out += "\\\"";
    else out += c;
  }
  return out;
}

void sample(std::string& out, const std::string& name, const std::vector<prometheus::ClientMetric::Label>& labels,
            const std::string& value, const char* extraName = nullptr, const std::string& extraValue = "") {
  out += name;
  if (!labels.empty() || extraName) {
    out += '{';
    bool first = true;
    for (const auto& l : labels) {
      out += fmt::format("{}{}=\"{}\"", first ? "" : ",", l.name, escaped(l.value, true));
      first = false;
    }
    if (extraName) out += fmt::format("{}{}=\"{}\"", first ? "" : ",", extraName, extraValue);
    out += '}';
  }
  out += ' ';
  out += value;
  out += '\n';
}

const char* typeName(prometheus::MetricType type) {
  switch (type) {
    case prometheus::MetricType::Counter: return "counter";
    case prometheus::MetricType::Gauge: return "gauge";
    case prometheus::MetricType::Summary: return "summary";
    case prometheus::MetricType::Histogram: return "histogram";
    default: return "untyped";
  }
}

}  // namespace

std::string prometheusText(const std::vector<prometheus::MetricFamily>& families) {
  std::string out;
  for (const auto& family : families) {
    if (family.metric.empty()) continue;
    out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", family.name, escaped(family.help, false), family.name,
                       typeName(family.type));
    for (const auto& m : family.metric) {
      switch (family.type) {
        case prometheus::MetricType::Counter:
          sample(out, family.name, m.label, number(m.counter.value));
          break;
        case prometheus::MetricType::Gauge:
          sample(out, family.name, m.label, number(m.gauge.value));
          break;
        case prometheus::MetricType::Histogram:
          for (const auto& b : m.histogram.bucket) {
            sample(out, family.name + "_bucket", m.label, std::to_string(b.cumulative_count), "le",
                   number(b.upper_bound));
          }
          sample(out, family.name + "_sum", m.label, number(m.histogram.sample_sum));
          sample(out, family.name + "_count", m.label, std::to_string(m.histogram.sample_count));
          break;
        case prometheus::MetricType::Summary:
          for (const auto& q : m.summary.quantile) {
            sample(out, family.name, m.label, number(q.value), "quantile", number(q.quantile));
          }
          sample(out, family.name + "_sum", m.label, number(m.summary.sample_sum));
          sample(out, family.name + "_count", m.label, std::to_string(m.summary.sample_count));
          break;
        default:
          sample(out, family.name, m.label, number(m.untyped.value));
      }
    }
  }
  return out;
}

}  // namespace loom
