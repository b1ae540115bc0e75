#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"

namespace loom::convert {

// A tensor of a torch.save file, not its data: which storage (the archive's member data/<key>)
// holds it, and where in it.
struct TensorRef {
  std::string storage;       // the storage's key
  std::string dtype;         // "float32", "bfloat16", "float16", "int64", ... (the storage's type)
  int64_t elementBytes = 0;  // of the dtype
  int64_t storageElements = 0;
  int64_t offset = 0;  // in elements, into the storage
  std::vector<int64_t> shape, stride;

  int64_t numel() const;
  // Whether the elements lie end to end in the storage, in row-major order.
  bool contiguous() const;
};

// The value a pickle builds, for the types torch.save writes into checkpoints and nothing more.
struct PickleValue;
using PickleRef = std::shared_ptr<PickleValue>;

struct PickleValue {
  enum class Kind { kNone, kBool, kInt, kFloat, kString, kBytes, kTuple, kList, kDict, kTensor, kObject };
  Kind kind = Kind::kNone;
  bool boolean = false;
  int64_t integer = 0;
  double real = 0;
  std::string text;  // string, bytes; an object's class, "module.name"
  // tuple and list: the items; dict: key, value, key, value... in insertion order; object: the
  // arguments it was made with, then (when it had one) the state BUILD gave it.
  std::vector<PickleRef> items;
  TensorRef tensor;

  // A dict's value for a string key; null when absent or not a dict.
  const PickleValue* get(const std::string& key) const;
  bool isString() const { return kind == Kind::kString; }
  bool isSequence() const { return kind == Kind::kTuple || kind == Kind::kList; }
  // "dict", "tensor", ... for messages.
  const char* kindName() const;
};

// Reads the pickle of a torch.save file (its data.pkl) without running anything: the opcodes of
// protocols 2 to 5 that build plain values, and a fixed list of globals, each turned into data
// (torch's tensor rebuild functions, its storage types, OrderedDict, torch.Size, and the few
// classes DeepSpeed's checkpoints hold as records). A global not on the list, an opcode outside
// the subset, and a truncated or malformed stream are INVALID_ARGUMENT naming `source` and the
// byte offset, and nothing of the pickle is used. Depth and size are bounded, so any input
// (see tests/fuzz/) ends in a value or an error.
StatusOr<PickleRef> readTorchPickle(const std::string& bytes, const std::string& source);

// The globals readTorchPickle accepts, "module.name", for messages and docs.
const std::vector<std::string>& allowedPickleGlobals();

}  // namespace loom::convert
