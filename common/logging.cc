#include "common/logging.h"

#include <cstdlib>

#include <spdlog/sinks/stdout_sinks.h>

namespace loom {

void initLogging(const std::string& component, const std::string& level) {
  auto logger = spdlog::stderr_logger_mt(component);
  logger->set_pattern("[%Y-%m-%d %H:%M:%S.%e] [%^%l%$] [%n] %v");
  const char* env = std::getenv("LOOM_LOG_LEVEL");
  logger->set_level(spdlog::level::from_str(env ? env : level));
  logger->flush_on(spdlog::level::info);
  spdlog::set_default_logger(logger);
}

}  // namespace loom
