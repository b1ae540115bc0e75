#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace loom::planner {

// A file of the web page (planner/web/), built into the binary so that the planner needs no
// installed data files.
struct WebAsset {
  std::string path;  // relative to planner/web/
  std::string_view content;
  const char* contentType;
};

// Generated at build time (cmake/EmbedFiles.cmake) from planner/web/.
const std::vector<WebAsset>& webAssets();

}  // namespace loom::planner
