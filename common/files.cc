#include "common/files.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <fcntl.h>
#include <unistd.h>

namespace loom::files {
namespace fs = std::filesystem;

StatusOr<std::string> readFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return errnoStatus("cannot open " + path);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

static Status fsyncPath(const std::string& path, int flags) {
  int fd = ::open(path.c_str(), flags);
  if (fd < 0) return errnoStatus("open " + path);
  int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) return errnoStatus("fsync " + path);
  return Status::ok();
}

Status writeFileAtomic(const std::string& path, const std::string& content) {
  std::string tmp = path + ".tmp." + std::to_string(::getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return errnoStatus("create " + tmp);
  size_t done = 0;
  while (done < content.size()) {
    ssize_t n = ::write(fd, content.data() + done, content.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      Status s = errnoStatus("write " + tmp);
      ::close(fd);
      ::unlink(tmp.c_str());
      return s;
    }
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0) {
    Status s = errnoStatus("fsync " + tmp);
    ::close(fd);
    ::unlink(tmp.c_str());
    return s;
  }
  ::close(fd);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    Status s = errnoStatus("rename " + tmp + " to " + path);
    ::unlink(tmp.c_str());
    return s;
  }
  std::string dir = fs::path(path).parent_path().string();
  return fsyncPath(dir.empty() ? "." : dir, O_RDONLY | O_DIRECTORY);
}

Status makeDirs(const std::string& path) {
  std::error_code ec;
  fs::create_directories(path, ec);
  if (ec) return internalError("cannot create directory {}: {}", path, ec.message());
  return Status::ok();
}

Status removeAll(const std::string& path) {
  std::error_code ec;
  fs::remove_all(path, ec);
  if (ec) return internalError("cannot remove {}: {}", path, ec.message());
  return Status::ok();
}

bool exists(const std::string& path) {
  std::error_code ec;
  return fs::exists(path, ec);
}

std::vector<std::string> listFiles(const std::string& dir, const std::string& suffix) {
  std::vector<std::string> out;
  std::error_code ec;
  for (auto it = fs::directory_iterator(dir, ec); !ec && it != fs::directory_iterator(); it.increment(ec)) {
    if (!it->is_regular_file()) continue;
    std::string name = it->path().filename().string();
    if (name.size() >= suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0)
      out.push_back(it->path().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::string selfDir() {
  std::error_code ec;
  auto exe = fs::read_symlink("/proc/self/exe", ec);
  return ec ? std::string(".") : exe.parent_path().string();
}

}  // namespace loom::files
