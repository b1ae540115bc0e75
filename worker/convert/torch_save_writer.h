#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "worker/convert/zip_archive.h"

namespace loom::convert {

// A value of the pickle torch.save writes, for the types checkpoints hold: None, bools, ints,
// floats, strings, lists, tuples, dicts (keys of any of these kinds, in insertion order) and
// tensors, whose bytes the writer asks for when it writes their storage.
class SaveValue {
 public:
  enum class Kind { kNone, kBool, kInt, kFloat, kString, kList, kTuple, kDict, kTensor };
  using Items = std::vector<SaveValue>;
  using Pairs = std::vector<std::pair<SaveValue, SaveValue>>;

  SaveValue() = default;  // None
  SaveValue(bool v) : kind_(Kind::kBool), integer_(v) {}
  SaveValue(int v) : kind_(Kind::kInt), integer_(v) {}
  SaveValue(int64_t v) : kind_(Kind::kInt), integer_(v) {}
  SaveValue(double v) : kind_(Kind::kFloat), real_(v) {}
  SaveValue(const char* v) : kind_(Kind::kString), text_(v) {}
  SaveValue(std::string v) : kind_(Kind::kString), text_(std::move(v)) {}
  static SaveValue list(Items items);
  static SaveValue tuple(Items items);
  static SaveValue dict(Pairs pairs);
  // Tensor number `index` of the file (an index into writeTorchSave's `tensors`).
  static SaveValue tensor(size_t index);
  // A JSON value as Python's json.load would read it: objects as dicts, arrays as lists.
  static SaveValue fromJson(const nlohmann::json& value);

  Kind kind() const { return kind_; }
  // A dict's entry for key `key`, added (or replaced).
  void set(const SaveValue& key, SaveValue value);

 private:
  friend class PickleBuilder;
  static SaveValue sequence(Kind kind, Items items);
  Kind kind_ = Kind::kNone;
  int64_t integer_ = 0;  // bool, int; tensor: its index
  double real_ = 0;
  std::string text_;
  Items items_;
  Pairs pairs_;
};

// A tensor of the file: contiguous, row-major, on the CPU. `dtype` as torch names it: "float32",
// "bfloat16", "float16", "float64", "int64", "int32", "int16", "int8", "uint8", "bool".
struct SaveTensor {
  std::string dtype;
  std::vector<int64_t> shape;

  int64_t bytes() const;
};

// The bytes of tensor `index`, handed to the sink in pieces that add up to its size.
using SaveTensorBytes = std::function<Status(size_t index, const ZipWriter::Sink& sink)>;

// A file that torch.load reads (weights_only or not) to `root`: torch.save's zip format
// (<stem>/data.pkl, a pickle of protocol 2 as torch.save writes one; each tensor's storage as
// <stem>/data/<i>; byteorder; version), every tensor built by torch._utils._rebuild_tensor_v2 over
// its own storage. A tensor's bytes stream from `bytes` to the file, so none is held whole.
Status writeTorchSave(const std::string& path, const SaveValue& root, const std::vector<SaveTensor>& tensors,
                      const SaveTensorBytes& bytes);

// The storage class torch.save names for a dtype ("torch.FloatStorage"); empty for one it has not.
std::string torchStorageClass(const std::string& dtype);

}  // namespace loom::convert
