#pragma once

// The release every binary reports with --version (the project's version in CMakeLists.txt).
namespace loom {

inline constexpr const char* kVersion = LOOM_VERSION;

}  // namespace loom
