#pragma once

#include <string>

#include <spdlog/spdlog.h>

namespace loom {

// Sets the default logger: "[time] [level] [component] message" on stderr. `level` is one of
// spdlog's names (trace, debug, info, warn, error); LOOM_LOG_LEVEL overrides it.
void initLogging(const std::string& component, const std::string& level = "info");

}  // namespace loom
