#include <fmt/format.h>

#include "client/plot/chart.h"

namespace loom::plot {

namespace {

std::string rgb(Color c) { return fmt::format("#{:02x}{:02x}{:02x}", c.r, c.g, c.b); }

std::string escaped(const std::string& text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '&': out += "&amp;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

}  // namespace

std::string toSvg(const Drawing& d) {
  std::string out = fmt::format(
      "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0}\" height=\"{1}\" viewBox=\"0 0 {0} {1}\">\n"
      "<rect width=\"{0}\" height=\"{1}\" fill=\"#ffffff\"/>\n",
      d.width, d.height);
  for (const Line& l : d.lines) {
    out += fmt::format("<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"{}\" stroke-width=\"{}\"/>\n",
                       l.x0, l.y0, l.x1, l.y1, rgb(l.color), l.width);
  }
  for (const Polyline& p : d.polylines) {
    out += fmt::format("<polyline fill=\"none\" stroke=\"{}\" stroke-width=\"{}\" stroke-linejoin=\"round\" points=\"",
                       rgb(p.color), p.width);
    for (size_t i = 0; i < p.points.size(); ++i)
      out += fmt::format("{}{:.1f},{:.1f}", i ? " " : "", p.points[i].first, p.points[i].second);
    out += "\"/>\n";
  }
  for (const Text& t : d.texts) {
    const char* anchor = t.anchor == Anchor::kStart ? "start" : t.anchor == Anchor::kMiddle ? "middle" : "end";
    // A capital letter is about 0.72 of the font size in the usual sans-serif faces.
    out += fmt::format(
        "<text x=\"{:.1f}\" y=\"{:.1f}\" font-family=\"sans-serif\" font-size=\"{:.1f}\" fill=\"{}\" "
        "text-anchor=\"{}\">{}</text>\n",
        t.x, t.y, t.size / 0.72, rgb(t.color), anchor, escaped(t.text));
  }
  out += "</svg>\n";
  return out;
}

}  // namespace loom::plot
