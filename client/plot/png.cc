#include <algorithm>
#include <cmath>

#include <zlib.h>

#include "client/plot/chart.h"
#include "client/plot/font.h"

namespace loom::plot {

namespace {

// An RGB raster that lines and text are blended into by coverage (anti-aliased).
class Canvas {
 public:
  Canvas(int width, int height) : width_(width), height_(height), pixels_(size_t(width) * height * 3, 255) {}

  void blend(int x, int y, Color c, double coverage) {
    if (x < 0 || y < 0 || x >= width_ || y >= height_ || coverage <= 0) return;
    coverage = std::min(1.0, coverage);
    uint8_t* p = &pixels_[(size_t(y) * width_ + x) * 3];
    const uint8_t rgb[3] = {c.r, c.g, c.b};
    for (int i = 0; i < 3; ++i) p[i] = static_cast<uint8_t>(std::lround(p[i] + (rgb[i] - p[i]) * coverage));
  }

  // A segment of the given width: each pixel near it is covered by how far its centre lies
  // inside the stroke (a one-pixel ramp at the edge).
  void segment(double x0, double y0, double x1, double y1, Color c, double width) {
    const double half = width / 2;
    const int left = static_cast<int>(std::floor(std::min(x0, x1) - half - 1));
    const int right = static_cast<int>(std::ceil(std::max(x0, x1) + half + 1));
    const int top = static_cast<int>(std::floor(std::min(y0, y1) - half - 1));
    const int bottom = static_cast<int>(std::ceil(std::max(y0, y1) + half + 1));
    const double dx = x1 - x0, dy = y1 - y0, length2 = dx * dx + dy * dy;
    for (int y = std::max(0, top); y <= std::min(height_ - 1, bottom); ++y) {
      for (int x = std::max(0, left); x <= std::min(width_ - 1, right); ++x) {
        const double cx = x + 0.5, cy = y + 0.5;
        double t = length2 > 0 ? ((cx - x0) * dx + (cy - y0) * dy) / length2 : 0;
        t = std::clamp(t, 0.0, 1.0);
        const double ex = x0 + t * dx - cx, ey = y0 + t * dy - cy;
        const double distance = std::sqrt(ex * ex + ey * ey);
        blend(x, y, c, half + 0.5 - distance);
      }
    }
  }

  // Text in the 5 x 7 font, scaled so that a glyph is `size` pixels tall; returns nothing, the
  // caller placed it by textWidth().
  void text(double x, double baseline, const std::string& s, int size, Color c) {
    const int scale = std::max(1, static_cast<int>(std::lround(size / 7.0)));
    const int top = static_cast<int>(std::lround(baseline)) - 7 * scale;
    int penX = static_cast<int>(std::lround(x));
    for (char ch : s) {
      const Glyph& g = glyphOf(ch);
      for (int row = 0; row < 7; ++row) {
        for (int col = 0; col < 5; ++col) {
          if (!(g[row] & (1u << (4 - col)))) continue;
          for (int dy = 0; dy < scale; ++dy) {
            for (int dx = 0; dx < scale; ++dx) blend(penX + col * scale + dx, top + row * scale + dy, c, 1);
          }
        }
      }
      penX += 6 * scale;
    }
  }

  static double textWidth(const std::string& s, int size) {
    const int scale = std::max(1, static_cast<int>(std::lround(size / 7.0)));
    return s.empty() ? 0 : static_cast<double>(6 * scale * s.size() - scale);
  }

  int width() const { return width_; }
  int height() const { return height_; }
  const uint8_t* row(int y) const { return &pixels_[size_t(y) * width_ * 3]; }

 private:
  int width_, height_;
  std::vector<uint8_t> pixels_;
};

void putBigEndian(std::string& out, uint32_t v) {
  for (int shift = 24; shift >= 0; shift -= 8) out += static_cast<char>((v >> shift) & 0xff);
}

void putChunk(std::string& out, const char* type, const std::string& data) {
  putBigEndian(out, static_cast<uint32_t>(data.size()));
  std::string typed = std::string(type, 4) + data;
  out += typed;
  putBigEndian(out, static_cast<uint32_t>(crc32(0, reinterpret_cast<const Bytef*>(typed.data()), typed.size())));
}

std::string encodePng(const Canvas& canvas) {
  // Each scanline starts with its filter byte (0: none).
  std::string raw;
  raw.reserve(size_t(canvas.height()) * (canvas.width() * 3 + 1));
  for (int y = 0; y < canvas.height(); ++y) {
    raw += '\0';
    raw.append(reinterpret_cast<const char*>(canvas.row(y)), size_t(canvas.width()) * 3);
  }
  uLongf packedSize = compressBound(raw.size());
  std::string packed(packedSize, '\0');
  compress2(reinterpret_cast<Bytef*>(packed.data()), &packedSize, reinterpret_cast<const Bytef*>(raw.data()),
            raw.size(), Z_BEST_COMPRESSION);
  packed.resize(packedSize);

  std::string header;
  putBigEndian(header, static_cast<uint32_t>(canvas.width()));
  putBigEndian(header, static_cast<uint32_t>(canvas.height()));
  header += std::string("\x08\x02\x00\x00\x00", 5);  // 8 bits per channel, RGB, deflate, no interlace
  std::string out("\x89PNG\r\n\x1a\n", 8);
  putChunk(out, "IHDR", header);
  putChunk(out, "IDAT", packed);
  putChunk(out, "IEND", "");
  return out;
}

}  // namespace

std::string toPng(const Drawing& d) {
  Canvas canvas(d.width, d.height);
  for (const Line& l : d.lines) canvas.segment(l.x0, l.y0, l.x1, l.y1, l.color, l.width);
  for (const Polyline& p : d.polylines) {
    if (p.points.size() == 1) canvas.segment(p.points[0].first, p.points[0].second, p.points[0].first,
                                             p.points[0].second, p.color, p.width * 1.5);
    for (size_t i = 1; i < p.points.size(); ++i) {
      canvas.segment(p.points[i - 1].first, p.points[i - 1].second, p.points[i].first, p.points[i].second, p.color,
                     p.width);
    }
  }
  for (const Text& t : d.texts) {
    const double w = Canvas::textWidth(t.text, t.size);
    const double x = t.anchor == Anchor::kStart ? t.x : t.anchor == Anchor::kMiddle ? t.x - w / 2 : t.x - w;
    canvas.text(x, t.y, t.text, t.size, t.color);
  }
  return encodePng(canvas);
}

}  // namespace loom::plot
