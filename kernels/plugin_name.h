#pragma once

#include <string>
#include <string_view>

namespace loom::kernels {

// A job names a kernel plugin, never a path: "cuda", or its file name "libloom_kernels_cuda.so".
// Nodes look the name up in their operator's kernel directories (loomd --kernel-dir), so a spec
// cannot make a rank load a library of its own choosing.
inline constexpr std::string_view kPluginPrefix = "libloom_kernels_";
inline constexpr std::string_view kPluginSuffix = ".so";

// The short name ("cuda") of a plugin name or file name; empty when `name` is neither (a path,
// an empty string, characters other than lower-case letters, digits and '_').
inline std::string pluginShortName(std::string_view name) {
  if (name.size() > kPluginPrefix.size() + kPluginSuffix.size() &&
      name.substr(0, kPluginPrefix.size()) == kPluginPrefix &&
      name.substr(name.size() - kPluginSuffix.size()) == kPluginSuffix)
    name = name.substr(kPluginPrefix.size(), name.size() - kPluginPrefix.size() - kPluginSuffix.size());
  if (name.empty() || name.size() > 64) return "";
  for (char c : name)
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_')) return "";
  return std::string(name);
}

// "libloom_kernels_cuda.so" for "cuda".
inline std::string pluginFileName(const std::string& shortName) {
  return std::string(kPluginPrefix) + shortName + std::string(kPluginSuffix);
}

}  // namespace loom::kernels
