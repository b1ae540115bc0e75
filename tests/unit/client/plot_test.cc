#include "client/plot/chart.h"

#include <cstring>

#include <zlib.h>

#include "tests/catch.h"

using namespace loom::plot;

namespace {

uint32_t bigEndian(const std::string& s, size_t at) {
  return (uint32_t(uint8_t(s[at])) << 24) | (uint32_t(uint8_t(s[at + 1])) << 16) | (uint32_t(uint8_t(s[at + 2])) << 8) |
         uint32_t(uint8_t(s[at + 3]));
}

// The RGB rows of a PNG written by toPng (filter 0 scanlines), its chunks' CRCs checked.
std::vector<std::string> decodeRows(const std::string& png, uint32_t& width, uint32_t& height) {
  REQUIRE(png.compare(0, 8, std::string("\x89PNG\r\n\x1a\n", 8)) == 0);
  std::string idat;
  for (size_t at = 8; at < png.size();) {
    const uint32_t length = bigEndian(png, at);
    const std::string typed = png.substr(at + 4, 4 + length);
    CHECK(crc32(0, reinterpret_cast<const Bytef*>(typed.data()), typed.size()) == bigEndian(png, at + 8 + length));
    if (typed.compare(0, 4, "IHDR") == 0) {
      width = bigEndian(typed, 4);
      height = bigEndian(typed, 8);
    }
    if (typed.compare(0, 4, "IDAT") == 0) idat += typed.substr(4);
    at += 12 + length;
  }
  std::string raw(size_t(height) * (width * 3 + 1), '\0');
  uLongf size = raw.size();
  REQUIRE(uncompress(reinterpret_cast<Bytef*>(raw.data()), &size, reinterpret_cast<const Bytef*>(idat.data()),
                     idat.size()) == Z_OK);
  REQUIRE(size == raw.size());
  std::vector<std::string> rows;
  for (uint32_t y = 0; y < height; ++y) {
    CHECK(raw[y * (width * 3 + 1)] == 0);
    rows.push_back(raw.substr(y * (width * 3 + 1) + 1, width * 3));
  }
  return rows;
}

}  // namespace

TEST_CASE("plot ticks - round steps that cover the range", "[plot]") {
  CHECK(niceTicks(0, 10, 5) == std::vector<double>{0, 2, 4, 6, 8, 10});
  const auto fine = niceTicks(2.31, 2.79, 5);
  REQUIRE(fine.size() == 6);
  for (size_t i = 0; i < fine.size(); ++i) CHECK(fine[i] == Approx(2.3 + 0.1 * static_cast<double>(i)));
  const auto big = niceTicks(1, 240, 6);
  CHECK(big.front() == 0);
  CHECK(big.back() >= 240);
  CHECK(big[1] - big[0] == 50);
  CHECK(tickLabel(2.5, 0.1) == "2.5");
  CHECK(tickLabel(200, 50) == "200");
  CHECK(tickLabel(3e-5, 1e-5) == "3.00e-05");
}

TEST_CASE("plot PNG - the curve's pixels lie where its points are, the rest is white", "[plot]") {
  Figure figure{.title = "job x", .panels = {{.name = "loss", .points = {{1, 4.0}, {50, 3.0}, {100, 2.0}}}}};
  const Drawing drawing = layout(figure);
  CHECK(drawing.width == 960);
  CHECK(drawing.height == 36 + 280);
  REQUIRE(drawing.polylines.size() == 1);
  const auto& curve = drawing.polylines[0].points;
  REQUIRE(curve.size() == 3);
  CHECK(curve[0].first < curve[2].first);   // steps grow to the right
  CHECK(curve[0].second < curve[2].second);  // a larger value is drawn higher (a smaller pixel row)
  uint32_t width = 0, height = 0;
  const auto rows = decodeRows(toPng(drawing), width, height);
  CHECK(width == 960);
  CHECK(height == 316);
  // The middle point of the curve is drawn in the curve's colour.
  const int x = static_cast<int>(curve[1].first), y = static_cast<int>(curve[1].second);
  const std::string pixel = rows[y].substr(x * 3, 3);
  CHECK(pixel == std::string("\x2f\x6f\xdb", 3));
  // A corner far from any line or text is white.
  CHECK(rows[height - 2].substr((width - 2) * 3, 3) == std::string("\xff\xff\xff", 3));
}

TEST_CASE("plot SVG - one polyline per panel, text escaped", "[plot]") {
  Figure figure{.title = "job <a&b>", .panels = {{.name = "loss", .points = {{1, 2}, {2, 1}}},
                                                  {.name = "lr", .points = {}}}};
  const std::string svg = toSvg(layout(figure));
  CHECK(svg.find("job &lt;a&amp;b&gt;") != std::string::npos);
  size_t polylines = 0;
  for (size_t at = svg.find("<polyline"); at != std::string::npos; at = svg.find("<polyline", at + 1)) ++polylines;
  CHECK(polylines == 2);
  CHECK(svg.find("no data") != std::string::npos);  // the empty panel says so
}
