#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "worker/checkpoint/safetensors_writer.h"

namespace loom::checkpoint {

// One tensor of a safetensors file, as its header describes it.
struct StoredTensor {
  SafetensorsEntry entry;  // name, dtype, shape
  int64_t offset = 0;      // of its first byte in the file
  int64_t numel() const;
};

// A safetensors file opened for reading, its header parsed and checked (every entry's dtype,
// shape and data_offsets within the file), its data read with pread on demand: a reader never
// holds more than the caller asks for. Errors name the file and the tensor.
class SafetensorsFile {
 public:
  static StatusOr<std::unique_ptr<SafetensorsFile>> open(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  // In the header's order.
  const std::vector<StoredTensor>& tensors() const { return tensors_; }
  // nullptr when the file has no tensor of that name.
  const StoredTensor* find(const std::string& name) const;
  // `bytes` bytes of the file from `offset` into `out`.
  Status read(int64_t offset, int64_t bytes, void* out) const;

 private:
  SafetensorsFile(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}
  std::string path_;
  int fd_ = -1;
  std::vector<StoredTensor> tensors_;
  std::map<std::string, size_t> byName_;
};

// The files of a model directory as Hugging Face lays it out: model.safetensors, or the shards
// model.safetensors.index.json maps (each once, in name order). `path` may also be one file.
StatusOr<std::vector<std::string>> modelFiles(const std::string& path);

}  // namespace loom::checkpoint
