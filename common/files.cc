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

Status syncDirectory(const std::string& dir) { return fsyncPath(dir.empty() ? "." : dir, O_RDONLY | O_DIRECTORY); }

StatusOr<std::unique_ptr<AtomicFileWriter>> AtomicFileWriter::open(const std::string& path, unsigned mode) {
  std::string tmp = path + ".tmp." + std::to_string(::getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
  if (fd < 0) return errnoStatus("create " + tmp);
  return std::unique_ptr<AtomicFileWriter>(new AtomicFileWriter(path, std::move(tmp), fd));
}

AtomicFileWriter::~AtomicFileWriter() {
  if (fd_ < 0) return;
  ::close(fd_);
  ::unlink(tmp_.c_str());
}

Status AtomicFileWriter::append(const void* data, size_t bytes) {
  const char* p = static_cast<const char*>(data);
  size_t done = 0;
  while (done < bytes) {
    ssize_t n = ::write(fd_, p + done, bytes - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return errnoStatus("write " + tmp_);
    }
    done += static_cast<size_t>(n);
  }
  return Status::ok();
}

Status AtomicFileWriter::commit() {
  if (::fsync(fd_) != 0) return errnoStatus("fsync " + tmp_);
  ::close(fd_);
  fd_ = -1;
  if (::rename(tmp_.c_str(), path_.c_str()) != 0) {
    Status s = errnoStatus("rename " + tmp_ + " to " + path_);
    ::unlink(tmp_.c_str());
    return s;
  }
  return syncDirectory(fs::path(path_).parent_path().string());
}

Status writeFileAtomic(const std::string& path, const std::string& content, unsigned mode) {
  ASSIGN_OR_RETURN(auto writer, AtomicFileWriter::open(path, mode));
  RETURN_IF_ERROR(writer->append(content.data(), content.size()));
  return writer->commit();
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
