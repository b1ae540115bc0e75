#pragma once

#include <cstdint>
#include <vector>

namespace loom {

// The elements of a tensor of `shape` (1 for a scalar's empty shape).
inline int64_t numelOf(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

}  // namespace loom
