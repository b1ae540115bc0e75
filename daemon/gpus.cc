#include "daemon/gpus.h"

#include <cstdlib>
#include <filesystem>
#include <set>

namespace loom::daemon {

std::vector<int> detectGpus() {
  std::error_code ec;
  int count = 0;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/driver/nvidia/gpus", ec)) {
    (void)entry;
    ++count;
  }
  std::vector<int> gpus(static_cast<size_t>(count));
  for (int i = 0; i < count; ++i) gpus[static_cast<size_t>(i)] = i;
  return gpus;
}

StatusOr<std::vector<int>> parseGpuList(const std::string& text) {
  std::vector<int> gpus;
  if (text == "none") return gpus;
  size_t begin = 0;
  while (begin <= text.size()) {
    const size_t comma = std::min(text.find(',', begin), text.size());
    const std::string item = text.substr(begin, comma - begin);
    char* end = nullptr;
    const long index = std::strtol(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || index < 0 || index > 1023)
      return invalidArgument("--gpus: \"{}\" is not a GPU index (write 0,1,2,3, or none)", item);
    gpus.push_back(static_cast<int>(index));
    begin = comma + 1;
  }
  return gpus;
}

std::vector<int> freeGpus(const std::vector<int>& offered, const std::vector<int>& held) {
  std::multiset<int> free(offered.begin(), offered.end());
  for (int gpu : held) {
    if (auto taken = free.find(gpu); taken != free.end()) free.erase(taken);
  }
  return {free.begin(), free.end()};
}

std::string visibleDevices(const std::vector<int>& gpus) {
  std::string visible;
  for (int gpu : gpus) visible += (visible.empty() ? "" : ",") + std::to_string(gpu);
  return visible;
}

}  // namespace loom::daemon
