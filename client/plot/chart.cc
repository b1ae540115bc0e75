#include "client/plot/chart.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

namespace loom::plot {

namespace {

constexpr Color kInk{29, 35, 43};
constexpr Color kMuted{102, 112, 124};
constexpr Color kAxis{196, 202, 210};
constexpr Color kGrid{236, 239, 243};
constexpr Color kCurve{47, 111, 219};

constexpr double kLeft = 84, kRight = 24, kTop = 40, kBottom = 48;
constexpr int kTickText = 12, kTitleText = 14;

std::string shortValue(double v) {
  const double a = std::fabs(v);
  if (a != 0 && (a >= 1e5 || a < 1e-3)) return fmt::format("{:.3e}", v);
  return fmt::format("{:.5g}", v);
}

void layoutPanel(const Series& series, double top, double width, double height, Drawing& out) {
  const double x0px = kLeft, x1px = width - kRight, y0px = top + kTop, y1px = top + height - kBottom;
  double xlo = 0, xhi = 1, ylo = 0, yhi = 1;
  if (!series.points.empty()) {
    xlo = xhi = series.points.front().first;
    ylo = yhi = series.points.front().second;
    for (const auto& [x, y] : series.points) {
      xlo = std::min(xlo, x), xhi = std::max(xhi, x), ylo = std::min(ylo, y), yhi = std::max(yhi, y);
    }
  }
  if (xhi == xlo) xhi = xlo + 1;
  if (yhi == ylo) {
    const double pad = std::fabs(ylo) * 0.05 + (ylo == 0 ? 1 : 0);
    ylo -= pad, yhi += pad;
  }
  const std::vector<double> yTicks = niceTicks(ylo, yhi, 5);
  ylo = std::min(ylo, yTicks.front()), yhi = std::max(yhi, yTicks.back());
  const std::vector<double> xTicks = niceTicks(xlo, xhi, 6);
  auto px = [&](double x) { return x0px + (x - xlo) / (xhi - xlo) * (x1px - x0px); };
  auto py = [&](double y) { return y1px - (y - ylo) / (yhi - ylo) * (y1px - y0px); };

  const std::string latest = series.points.empty() ? "no data" : "last " + shortValue(series.points.back().second);
  out.texts.push_back({x0px, top + 24, series.name, kTitleText, Anchor::kStart, kInk});
  out.texts.push_back({x1px, top + 24, latest, kTickText, Anchor::kEnd, kMuted});
  const double yStep = yTicks.size() > 1 ? yTicks[1] - yTicks[0] : 1;
  for (double y : yTicks) {
    if (y < ylo || y > yhi) continue;
    out.lines.push_back({x0px, py(y), x1px, py(y), kGrid, 1});
    out.texts.push_back({x0px - 8, py(y) + kTickText / 2.0, tickLabel(y, yStep), kTickText, Anchor::kEnd, kMuted});
  }
  const double xStep = xTicks.size() > 1 ? xTicks[1] - xTicks[0] : 1;
  for (double x : xTicks) {
    if (x < xlo || x > xhi) continue;
    out.lines.push_back({px(x), y1px, px(x), y1px + 5, kAxis, 1});
    out.texts.push_back({px(x), y1px + 10 + kTickText, tickLabel(x, xStep), kTickText, Anchor::kMiddle, kMuted});
  }
  out.texts.push_back({(x0px + x1px) / 2, y1px + 12 + 2 * kTickText, "step", kTickText, Anchor::kMiddle, kMuted});
  out.lines.push_back({x0px, y0px, x0px, y1px, kAxis, 1});
  out.lines.push_back({x0px, y1px, x1px, y1px, kAxis, 1});
  Polyline curve{{}, kCurve, 2};
  for (const auto& [x, y] : series.points) curve.points.emplace_back(px(x), py(y));
  out.polylines.push_back(std::move(curve));
}

}  // namespace

std::vector<double> niceTicks(double lo, double hi, int count) {
  const double span = hi - lo;
  if (!(span > 0) || !std::isfinite(span)) return {lo};
  const double raw = span / std::max(1, count);
  const double magnitude = std::pow(10, std::floor(std::log10(raw)));
  double step = magnitude;
  for (double m : {1.0, 2.0, 5.0, 10.0}) {
    step = m * magnitude;
    if (step >= raw) break;
  }
  // Each tick a whole multiple of the step (not a running sum, whose error grows).
  std::vector<double> ticks;
  for (double k = std::floor(lo / step); k * step <= hi + step * 0.5 && ticks.size() < 100; k += 1) {
    ticks.push_back(k == 0 ? 0 : k * step);
  }
  return ticks;
}

std::string tickLabel(double value, double step) {
  const double a = std::max(std::fabs(value), std::fabs(step));
  if (a >= 1e6 || (a < 1e-3 && a > 0)) return fmt::format("{:.2e}", value);
  const int decimals = std::max(0, static_cast<int>(std::ceil(-std::log10(step) - 1e-9)));
  return fmt::format("{:.{}f}", value, decimals);
}

Drawing layout(const Figure& figure) {
  Drawing out;
  out.width = figure.width;
  const double titleHeight = figure.title.empty() ? 0 : 36;
  out.height = static_cast<int>(titleHeight) + figure.panelHeight * static_cast<int>(figure.panels.size());
  if (!figure.title.empty()) out.texts.push_back({kLeft, 26, figure.title, kTitleText, Anchor::kStart, kInk});
  for (size_t i = 0; i < figure.panels.size(); ++i) {
    layoutPanel(figure.panels[i], titleHeight + static_cast<double>(i) * figure.panelHeight, figure.width,
                figure.panelHeight, out);
  }
  return out;
}

}  // namespace loom::plot
