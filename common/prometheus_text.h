#pragma once

#include <string>
#include <vector>

#include <prometheus/metric_family.h>

namespace loom {

// Prometheus' text exposition format (version 0.0.4) of metric families, with every value
// written so that it reads back as the same double (prometheus-cpp's own serializer keeps 16
// significant digits, and a scraped loss would differ from the one `loomctl get` shows).
std::string prometheusText(const std::vector<prometheus::MetricFamily>& families);

// The content type a /metrics answer carries.
inline constexpr const char* kPrometheusContentType = "text/plain; version=0.0.4; charset=utf-8";

}  // namespace loom
