#pragma once

#include <string>
#include <vector>

#include "common/status.h"

namespace loom::files {

StatusOr<std::string> readFile(const std::string& path);
// Writes to a temporary file beside `path`, fsyncs it, renames it over `path` and fsyncs the
// directory: a reader sees the old content or the new, never a torn file.
Status writeFileAtomic(const std::string& path, const std::string& content);
Status makeDirs(const std::string& path);
Status removeAll(const std::string& path);
bool exists(const std::string& path);
// Regular files in `dir` whose names end with `suffix`, sorted; empty if `dir` does not exist.
std::vector<std::string> listFiles(const std::string& dir, const std::string& suffix = "");
// The directory holding the running executable (/proc/self/exe), to find sibling binaries.
std::string selfDir();

}  // namespace loom::files
