#pragma once

#include <memory>
#include <string>
#include <vector>

#include "common/status.h"

namespace loom::files {

StatusOr<std::string> readFile(const std::string& path);
// Writes to a temporary file beside `path`, fsyncs it, renames it over `path` and fsyncs the
// directory: a reader sees the old content or the new, never a torn file.
Status writeFileAtomic(const std::string& path, const std::string& content, unsigned mode = 0644);

// The same for content written piece by piece (a file larger than one wants to hold in memory):
// open() a temporary file beside `path`, append() to it, then commit() fsyncs it, renames it over
// `path` and fsyncs the directory. A writer destroyed before commit() removes its temporary file.
// Not thread-safe.
class AtomicFileWriter {
 public:
  static StatusOr<std::unique_ptr<AtomicFileWriter>> open(const std::string& path, unsigned mode = 0644);
  ~AtomicFileWriter();
  Status append(const void* data, size_t bytes);
  Status commit();

 private:
  AtomicFileWriter(std::string path, std::string tmp, int fd) : path_(std::move(path)), tmp_(std::move(tmp)), fd_(fd) {}
  std::string path_, tmp_;
  int fd_;
};
Status makeDirs(const std::string& path);
// fsyncs a directory: what was created, renamed or removed in it is on the disk.
Status syncDirectory(const std::string& dir);
Status removeAll(const std::string& path);
bool exists(const std::string& path);
// Regular files in `dir` whose names end with `suffix`, sorted; empty if `dir` does not exist.
std::vector<std::string> listFiles(const std::string& dir, const std::string& suffix = "");
// The directory holding the running executable (/proc/self/exe), to find sibling binaries.
std::string selfDir();

}  // namespace loom::files
