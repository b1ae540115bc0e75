#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

// Line charts of a job's metrics over steps, as SVG or PNG (`loomctl plot`). A figure is laid out
// once into pixel-space primitives (layout()); the SVG and the PNG writers draw the same ones.
namespace loom::plot {

struct Series {
  std::string name;
  std::vector<std::pair<double, double>> points;  // (step, value), by step
};

// One panel per series, stacked, each with its own value axis.
struct Figure {
  std::string title;
  std::vector<Series> panels;
  int width = 960;
  int panelHeight = 280;
};

struct Color {
  uint8_t r = 0, g = 0, b = 0;
};

struct Line {
  double x0, y0, x1, y1;
  Color color;
  double width;
};

struct Polyline {
  std::vector<std::pair<double, double>> points;
  Color color;
  double width;
};

enum class Anchor { kStart, kMiddle, kEnd };

struct Text {
  double x, y;  // y is the baseline
  std::string text;
  int size;  // pixel height of a capital letter
  Anchor anchor;
  Color color;
};

struct Drawing {
  int width = 0, height = 0;
  std::vector<Line> lines;
  std::vector<Polyline> polylines;
  std::vector<Text> texts;
};

Drawing layout(const Figure& figure);

// The ticks of an axis from lo to hi: about `count` round values (1, 2 or 5 times a power of ten).
std::vector<double> niceTicks(double lo, double hi, int count);
// A tick's label: as few digits as tell the ticks apart.
std::string tickLabel(double value, double step);

std::string toSvg(const Drawing& drawing);
// An 8-bit RGB PNG (zlib-compressed, CRC-checked chunks), text in a built-in bitmap font.
std::string toPng(const Drawing& drawing);

}  // namespace loom::plot
