#pragma once

#include <cstdint>
#include <string>

#include <fmt/format.h>

namespace loom {

// "512 B", "1.5 KiB", "64.0 MiB", "2.0 GiB". Header-only, so that torch-facing code (which sees
// the wheel's fmt) and the rest share it.
inline std::string humanBytes(int64_t b) {
  if (b >= (int64_t(1) << 30)) return fmt::format("{:.1f} GiB", b / double(int64_t(1) << 30));
  if (b >= (1 << 20)) return fmt::format("{:.1f} MiB", b / double(1 << 20));
  if (b >= (1 << 10)) return fmt::format("{:.1f} KiB", b / double(1 << 10));
  return fmt::format("{} B", b);
}

}  // namespace loom
