#include "worker/convert/torch_pickle.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include <fmt/format.h>

#include "common/shape.h"

namespace loom::convert {

namespace {

using Kind = PickleValue::Kind;

// What bounds any input, fuzzed or not.
constexpr size_t kMaxMarks = 100'000;
constexpr size_t kMaxMemo = 10'000'000;
constexpr size_t kMaxDims = 64;

// The storage types of torch.save's persistent ids, by name: the dtype and its element size.
struct StorageType {
  const char* name;
  const char* dtype;
  int64_t bytes;
};
constexpr StorageType kStorageTypes[] = {
    {"torch.FloatStorage", "float32", 4},   {"torch.DoubleStorage", "float64", 8}, {"torch.HalfStorage", "float16", 2},
    {"torch.BFloat16Storage", "bfloat16", 2}, {"torch.LongStorage", "int64", 8}, {"torch.IntStorage", "int32", 4},
    {"torch.ShortStorage", "int16", 2},     {"torch.CharStorage", "int8", 1},     {"torch.ByteStorage", "uint8", 1},
    {"torch.BoolStorage", "bool", 1},
};

// torch.<dtype> globals stand for themselves (state dicts keep a dtype now and then).
constexpr const char* kDtypes[] = {"torch.float32", "torch.float64", "torch.float16", "torch.bfloat16",
                                   "torch.int64",   "torch.int32",   "torch.int16",   "torch.int8",
                                   "torch.uint8",   "torch.bool"};

// Globals called to build a value (REDUCE), each turned into data here.
constexpr const char* kCallables[] = {
    "torch._utils._rebuild_tensor_v2", "torch._utils._rebuild_tensor", "torch._tensor._rebuild_from_type_v2",
    "torch._utils._rebuild_parameter", "torch._utils._rebuild_parameter_with_state", "collections.OrderedDict",
    "torch.Size", "_codecs.encode", "builtins.set", "builtins.frozenset", "torch.device",
    // Only as _rebuild_from_type_v2's type argument.
    "torch.Tensor", "torch.nn.parameter.Parameter",
};

// Classes DeepSpeed's checkpoints hold as records: their arguments and state are kept as data,
// nothing of theirs runs.
constexpr const char* kRecords[] = {
    "deepspeed.runtime.zero.config.ZeroStageEnum",
    "deepspeed.runtime.fp16.loss_scaler.LossScaler",
    "deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler",
    "deepspeed.utils.tensor_fragment.fragment_address",
};

// The members of the enums among those records. Python pickles an enum member by name
// (getattr(ZeroStageEnum, "gradients")) from 3.12 on, and so does Debian's 3.11; earlier ones call
// the class with the value (ZeroStageEnum(2)). Either way the member is read as the record of its
// value.
struct EnumMember {
  const char* type;
  const char* name;
  int64_t value;
};
constexpr EnumMember kEnumMembers[] = {
    {"deepspeed.runtime.zero.config.ZeroStageEnum", "disabled", 0},
    {"deepspeed.runtime.zero.config.ZeroStageEnum", "optimizer_states", 1},
    {"deepspeed.runtime.zero.config.ZeroStageEnum", "gradients", 2},
    {"deepspeed.runtime.zero.config.ZeroStageEnum", "weights", 3},
    {"deepspeed.runtime.zero.config.ZeroStageEnum", "max_stage", 3},
};

bool isGetattr(const std::string& name) { return name == "builtins.getattr" || name == "__builtin__.getattr"; }

template <size_t N>
bool listed(const char* const (&names)[N], const std::string& name) {
  return std::any_of(std::begin(names), std::end(names), [&](const char* n) { return name == n; });
}

const StorageType* storageType(const std::string& name) {
  for (const auto& t : kStorageTypes)
    if (name == t.name) return &t;
  return nullptr;
}

PickleRef make(Kind kind) {
  auto v = std::make_shared<PickleValue>();
  v->kind = kind;
  return v;
}

// A global on the stack, before it is called: an object of kind kObject with no items, marked.
constexpr const char* kGlobalMark = "\x01global:";
bool isGlobal(const PickleValue& v) { return v.kind == Kind::kObject && v.text.rfind(kGlobalMark, 0) == 0; }
std::string globalName(const PickleValue& v) { return v.text.substr(std::strlen(kGlobalMark)); }

class Reader {
 public:
  Reader(const std::string& bytes, const std::string& source) : in_(bytes), source_(source) {}

  StatusOr<PickleRef> run();
  // The opcodes by kind: each says whether `op` is one of its own (and runs it), run() asks each.
  StatusOr<bool> stackOpcode(unsigned char op);
  StatusOr<bool> valueOpcode(unsigned char op);
  StatusOr<bool> containerOpcode(unsigned char op);
  StatusOr<bool> objectOpcode(unsigned char op);
  StatusOr<bool> memoOpcode(unsigned char op);
  ~Reader() {
    // Values may point at each other in cycles a hostile pickle builds: break every link of the
    // values the result does not hold (all of them, when there is no result).
    for (auto& v : made_)
      if (!kept_.count(v.get())) v->items.clear();
  }

 private:
  template <typename... Args>
  Status error(fmt::format_string<Args...> f, Args&&... args) const {
    return invalidArgument("{}: offset {}: {}", source_, opcodeAt_, fmt::format(f, std::forward<Args>(args)...));
  }
  Status need(size_t n) const {
    if (n > in_.size() - pos_) return error("truncated: {} more bytes wanted, {} left", n, in_.size() - pos_);
    return Status::ok();
  }
  uint64_t le(int n) {
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(in_[pos_ + i]);
    pos_ += n;
    return v;
  }
  PickleRef keep(PickleRef v) {
    made_.push_back(v);
    return v;
  }
  PickleRef value(Kind kind) { return keep(make(kind)); }
  StatusOr<PickleRef> pop() {
    if (stack_.empty() || (!marks_.empty() && stack_.size() == marks_.back())) return error("the stack is empty");
    PickleRef v = std::move(stack_.back());
    stack_.pop_back();
    return v;
  }
  StatusOr<std::vector<PickleRef>> popMark() {
    if (marks_.empty()) return error("no mark to pop to");
    const size_t mark = marks_.back();
    marks_.pop_back();
    std::vector<PickleRef> items(std::make_move_iterator(stack_.begin() + static_cast<std::ptrdiff_t>(mark)),
                                 std::make_move_iterator(stack_.end()));
    stack_.resize(mark);
    return items;
  }
  StatusOr<PickleRef*> top() {
    if (stack_.empty() || (!marks_.empty() && stack_.size() == marks_.back())) return error("the stack is empty");
    return &stack_.back();
  }
  StatusOr<std::string> bytes(size_t n) {
    RETURN_IF_ERROR(need(n));
    std::string s = in_.substr(pos_, n);
    pos_ += n;
    return s;
  }
  StatusOr<std::string> line() {
    const size_t end = in_.find('\n', pos_);
    if (end == std::string::npos) return error("truncated: a global's name has no end of line");
    std::string s = in_.substr(pos_, end - pos_);
    pos_ = end + 1;
    return s;
  }
  Status pushGlobal(const std::string& module, const std::string& name);
  Status reduce(const PickleRef& callable, const PickleRef& args);
  Status build(PickleRef& target, const PickleRef& state);
  Status setItems(PickleValue& dict, std::vector<PickleRef> items);
  StatusOr<PickleRef> rebuildTensor(const std::vector<PickleRef>& args);
  StatusOr<PickleRef> persistent(const PickleRef& id);
  // Refuses a result that contains itself; otherwise records what it holds (kept_).
  Status checkAcyclic(const PickleRef& root);

  const std::string& in_;
  const std::string& source_;
  size_t pos_ = 0, opcodeAt_ = 0;
  std::vector<PickleRef> stack_;
  std::vector<size_t> marks_;
  std::unordered_map<uint64_t, PickleRef> memo_;
  std::vector<PickleRef> made_;
  std::unordered_set<const PickleValue*> kept_;  // reachable from the result, once it is checked
};

Status Reader::pushGlobal(const std::string& module, const std::string& name) {
  const std::string full = module + "." + name;
  if (listed(kDtypes, full)) {
    auto v = value(Kind::kString);
    v->text = full;
    stack_.push_back(v);
    return Status::ok();
  }
  if (!storageType(full) && !listed(kCallables, full) && !listed(kRecords, full) && !isGetattr(full))
    return error("global {} is not one that torch.save writes into a checkpoint: refused (nothing of a pickle runs "
                 "here; the globals read are torch's tensor rebuild functions and storage types, OrderedDict, "
                 "torch.Size and DeepSpeed's checkpoint records)",
                 full);
  auto v = value(Kind::kObject);
  v->text = kGlobalMark + full;
  stack_.push_back(v);
  return Status::ok();
}

StatusOr<PickleRef> Reader::persistent(const PickleRef& id) {
  // ('storage', storage type, key, location, numel)
  const auto& f = id->items;
  if (id->kind != Kind::kTuple || f.size() != 5 || !f[0]->isString() || f[0]->text != "storage" || !isGlobal(*f[1]) ||
      !f[2]->isString() || !f[3]->isString() || f[4]->kind != Kind::kInt)
    return error("a persistent id that is not torch.save's ('storage', type, key, location, numel)");
  const StorageType* type = storageType(globalName(*f[1]));
  if (!type) return error("persistent id: {} is not a storage type", globalName(*f[1]));
  if (f[4]->integer < 0) return error("persistent id: storage {} has {} elements", f[2]->text, f[4]->integer);
  auto v = value(Kind::kObject);
  v->text = "torch.storage";
  v->tensor.storage = f[2]->text;
  v->tensor.dtype = type->dtype;
  v->tensor.elementBytes = type->bytes;
  v->tensor.storageElements = f[4]->integer;
  return v;
}

StatusOr<PickleRef> Reader::rebuildTensor(const std::vector<PickleRef>& args) {
  // (storage, storage_offset, size, stride, ...)
  if (args.size() < 4 || args[0]->kind != Kind::kObject || args[0]->text != "torch.storage" ||
      args[1]->kind != Kind::kInt || !args[2]->isSequence() || !args[3]->isSequence())
    return error("_rebuild_tensor_v2: its arguments are not (storage, offset, size, stride, ...)");
  TensorRef t = args[0]->tensor;
  t.offset = args[1]->integer;
  if (args[2]->items.size() != args[3]->items.size() || args[2]->items.size() > kMaxDims)
    return error("_rebuild_tensor_v2: {} sizes and {} strides", args[2]->items.size(), args[3]->items.size());
  for (size_t i = 0; i < args[2]->items.size(); ++i) {
    const PickleValue &size = *args[2]->items[i], &stride = *args[3]->items[i];
    if (size.kind != Kind::kInt || stride.kind != Kind::kInt || size.integer < 0 || stride.integer < 0)
      return error("_rebuild_tensor_v2: dimension {} has size and stride that are not whole numbers >= 0", i);
    t.shape.push_back(size.integer);
    t.stride.push_back(stride.integer);
  }
  // Every element must lie inside the storage, and their count must fit an int64 with room.
  if (t.offset < 0) return error("_rebuild_tensor_v2: storage offset {}", t.offset);
  __int128 elements = 1;
  for (int64_t d : t.shape) {
    elements *= d;
    if (elements > (__int128(1) << 62)) return error("_rebuild_tensor_v2: a tensor of more than 2^62 elements");
  }
  if (t.numel() > 0) {
    __int128 last = t.offset;
    for (size_t i = 0; i < t.shape.size(); ++i) last += static_cast<__int128>(t.shape[i] - 1) * t.stride[i];
    if (last >= t.storageElements)
      return error("tensor of shape [{}] at offset {} reaches past its storage {} of {} elements",
                   fmt::join(t.shape, ", "), t.offset, t.storage, t.storageElements);
  }
  auto v = value(Kind::kTensor);
  v->tensor = std::move(t);
  return v;
}

Status Reader::reduce(const PickleRef& callable, const PickleRef& args) {
  if (!isGlobal(*callable)) return error("REDUCE of a {} (only a global can be called)", callable->kindName());
  if (args->kind != Kind::kTuple) return error("REDUCE with {} arguments (a tuple is needed)", args->kindName());
  const std::string name = globalName(*callable);
  const auto& a = args->items;
  auto push = [&](PickleRef v) {
    stack_.push_back(std::move(v));
    return Status::ok();
  };
  if (name == "torch._utils._rebuild_tensor_v2" || name == "torch._utils._rebuild_tensor") {
    ASSIGN_OR_RETURN(PickleRef t, rebuildTensor(a));
    return push(t);
  }
  if (name == "torch._tensor._rebuild_from_type_v2") {
    // (rebuild function, type, its arguments, attributes): a tensor subclass or one with Python
    // attributes (DeepSpeed's ds_id); the attributes are not data.
    if (a.size() != 4 || !isGlobal(*a[0]) || globalName(*a[0]) != "torch._utils._rebuild_tensor_v2" ||
        a[2]->kind != Kind::kTuple)
      return error("_rebuild_from_type_v2: only (_rebuild_tensor_v2, type, arguments, state) is read");
    ASSIGN_OR_RETURN(PickleRef t, rebuildTensor(a[2]->items));
    return push(t);
  }
  if (name == "torch._utils._rebuild_parameter" || name == "torch._utils._rebuild_parameter_with_state") {
    if (a.empty() || a[0]->kind != Kind::kTensor) return error("{}: its first argument is not a tensor", name);
    return push(a[0]);
  }
  if (name == "collections.OrderedDict") {
    auto dict = value(Kind::kDict);
    if (a.size() == 1 && a[0]->isSequence()) {  // OrderedDict([(key, value), ...])
      std::vector<PickleRef> flat;
      for (const auto& pair : a[0]->items) {
        if (!pair->isSequence() || pair->items.size() != 2) return error("OrderedDict: an item that is not a pair");
        flat.push_back(pair->items[0]);
        flat.push_back(pair->items[1]);
      }
      RETURN_IF_ERROR(setItems(*dict, std::move(flat)));
    } else if (!a.empty()) {
      return error("OrderedDict called with {} arguments", a.size());
    }
    return push(dict);
  }
  if (name == "torch.Size" || name == "builtins.set" || name == "builtins.frozenset") {
    auto out = value(name == "torch.Size" ? Kind::kTuple : Kind::kList);
    if (a.size() == 1 && a[0]->isSequence()) {
      out->items = a[0]->items;
    } else if (!a.empty()) {
      return error("{} called with {} arguments", name, a.size());
    }
    return push(out);
  }
  if (name == "_codecs.encode") {
    // Protocol 2's bytes: _codecs.encode(text, "latin1"), each code point below 256 one byte.
    if (a.size() != 2 || !a[0]->isString() || !a[1]->isString() || a[1]->text != "latin1")
      return error("_codecs.encode: only (text, \"latin1\") is read");
    auto out = value(Kind::kBytes);
    const std::string& s = a[0]->text;
    for (size_t i = 0; i < s.size(); ++i) {
      const auto c = static_cast<unsigned char>(s[i]);
      if (c < 0x80) {
        out->text.push_back(static_cast<char>(c));
      } else if ((c == 0xc2 || c == 0xc3) && i + 1 < s.size()) {
        out->text.push_back(static_cast<char>(((c & 0x03) << 6) | (static_cast<unsigned char>(s[++i]) & 0x3f)));
      } else {
        return error("_codecs.encode: a code point above 255 in latin1 text");
      }
    }
    return push(out);
  }
  if (name == "torch.Tensor" || name == "torch.nn.parameter.Parameter")
    return error("{} is read only as a tensor's type, not called", name);
  if (isGetattr(name)) {
    if (a.size() != 2 || !isGlobal(*a[0]) || !a[1]->isString())
      return error("getattr: only an enum member, getattr(enum class, member name), is read");
    const std::string type = globalName(*a[0]);
    for (const EnumMember& m : kEnumMembers) {
      if (type != m.type || a[1]->text != m.name) continue;
      auto member = value(Kind::kInt);
      member->integer = m.value;
      auto record = value(Kind::kObject);
      record->text = type;
      record->items = {member};
      return push(record);
    }
    return error("getattr({}, \"{}\"): not a member of an enum that DeepSpeed's checkpoints hold", type, a[1]->text);
  }
  if (name == "torch.device") {
    if (a.empty() || !a[0]->isString()) return error("torch.device: its first argument is not a string");
    return push(a[0]);
  }
  // A record class (an enum member, a loss scaler): its arguments kept as data.
  auto record = value(Kind::kObject);
  record->text = name;
  record->items = a;
  return push(record);
}

Status Reader::setItems(PickleValue& dict, std::vector<PickleRef> items) {
  if (dict.kind != Kind::kDict) return error("SETITEM(S) on a {}", dict.kindName());
  if (items.size() % 2) return error("SETITEMS with an odd number ({}) of keys and values", items.size());
  for (size_t i = 0; i < items.size(); i += 2) {
    // A key set again replaces its value, where it was.
    bool replaced = false;
    if (items[i]->isString()) {
      for (size_t k = 0; k + 1 < dict.items.size(); k += 2) {
        if (dict.items[k]->isString() && dict.items[k]->text == items[i]->text) {
          dict.items[k + 1] = items[i + 1];
          replaced = true;
          break;
        }
      }
    }
    if (!replaced) {
      dict.items.push_back(std::move(items[i]));
      dict.items.push_back(std::move(items[i + 1]));
    }
  }
  return Status::ok();
}

Status Reader::build(PickleRef& target, const PickleRef& state) {
  // A tensor's extra state (hooks, names) and a dict's attributes (an OrderedDict's _metadata, as
  // a module's state dict carries it) are not its data.
  if (target->kind == Kind::kTensor || target->kind == Kind::kDict) return Status::ok();
  if (target->kind != Kind::kObject || isGlobal(*target) || target->text == "torch.storage")
    return error("BUILD of a {}", target->kindName());
  target->items.push_back(state);
  return Status::ok();
}

Status Reader::checkAcyclic(const PickleRef& root) {
  // Iterative depth-first search: 1 on the path, 2 done.
  std::unordered_map<const PickleValue*, int> color;
  std::vector<std::pair<const PickleValue*, size_t>> path{{root.get(), 0}};
  color[root.get()] = 1;
  while (!path.empty()) {
    auto& [node, next] = path.back();
    if (next == node->items.size()) {
      color[node] = 2;
      path.pop_back();
      continue;
    }
    const PickleValue* child = node->items[next++].get();
    int& c = color[child];
    if (c == 1) return invalidArgument("{}: the pickle's values contain themselves (a cycle): refused", source_);
    if (c == 0) {
      c = 1;
      path.emplace_back(child, 0);
    }
  }
  for (const auto& [node, c] : color) kept_.insert(node);
  return Status::ok();
}

// PROTO, FRAME, MARK, POP, POP_MARK, DUP: the stream's framing and the stack itself.
StatusOr<bool> Reader::stackOpcode(unsigned char op) {
  switch (op) {
    case 0x80:  // PROTO
      RETURN_IF_ERROR(need(1));
      if (const uint64_t p = le(1); p < 2 || p > 5) return error("pickle protocol {} (2 to 5 are read)", p);
      return true;
    case 0x95:  // FRAME
      RETURN_IF_ERROR(need(8));
      le(8);
      return true;
    case '(':  // MARK
      if (marks_.size() >= kMaxMarks) return error("more than {} nested marks", kMaxMarks);
      marks_.push_back(stack_.size());
      return true;
    case '0': {  // POP
      ASSIGN_OR_RETURN(PickleRef ignored, pop());
      return true;
    }
    case '1': {  // POP_MARK
      ASSIGN_OR_RETURN(auto ignored, popMark());
      return true;
    }
    case '2': {  // DUP
      ASSIGN_OR_RETURN(PickleRef * t, top());
      stack_.push_back(*t);
      return true;
    }
    default:
      return false;
  }
}

// None, booleans, integers, floats, strings and bytes.
StatusOr<bool> Reader::valueOpcode(unsigned char op) {
  switch (op) {
    case 'N':
      stack_.push_back(value(Kind::kNone));
      return true;
    case 0x88:
    case 0x89: {  // NEWTRUE, NEWFALSE
      auto v = value(Kind::kBool);
      v->boolean = op == 0x88;
      stack_.push_back(v);
      return true;
    }
    case 'J':
    case 'K':
    case 'M': {  // BININT, BININT1, BININT2
      const int n = op == 'J' ? 4 : op == 'K' ? 1 : 2;
      RETURN_IF_ERROR(need(n));
      auto v = value(Kind::kInt);
      const uint64_t raw = le(n);
      v->integer = op == 'J' ? static_cast<int32_t>(raw) : static_cast<int64_t>(raw);
      stack_.push_back(v);
      return true;
    }
    case 0x8a:
    case 0x8b: {  // LONG1, LONG4
      const int width = op == 0x8a ? 1 : 4;
      RETURN_IF_ERROR(need(width));
      const uint64_t n = le(width);
      if (n > 8) return error("an integer of {} bytes (at most 8 are read)", n);
      RETURN_IF_ERROR(need(n));
      uint64_t raw = le(static_cast<int>(n));
      if (n > 0 && n < 8 && (raw >> (8 * n - 1)) & 1) raw |= ~uint64_t(0) << (8 * n);  // sign
      auto v = value(Kind::kInt);
      v->integer = static_cast<int64_t>(raw);
      stack_.push_back(v);
      return true;
    }
    case 'G': {  // BINFLOAT, big-endian
      RETURN_IF_ERROR(need(8));
      uint64_t raw = 0;
      for (int i = 0; i < 8; ++i) raw = (raw << 8) | static_cast<unsigned char>(in_[pos_ + i]);
      pos_ += 8;
      auto v = value(Kind::kFloat);
      std::memcpy(&v->real, &raw, 8);
      stack_.push_back(v);
      return true;
    }
    case 'X':
    case 0x8c:
    case 0x8d:
    case 'T':
    case 'U':
    case 'B':
    case 'C':
    case 0x8e: {  // BINUNICODE(8), SHORT_BINUNICODE, BINSTRING, SHORT_BINSTRING, BINBYTES(8), SHORT_BINBYTES
      const int width = (op == 0x8c || op == 'U' || op == 'C') ? 1 : (op == 0x8d || op == 0x8e) ? 8 : 4;
      RETURN_IF_ERROR(need(width));
      const uint64_t n = le(width);
      if (n > in_.size() - pos_) return error("truncated: a string of {} bytes, {} left", n, in_.size() - pos_);
      auto v = value(op == 'B' || op == 'C' || op == 0x8e ? Kind::kBytes : Kind::kString);
      ASSIGN_OR_RETURN(v->text, bytes(static_cast<size_t>(n)));
      stack_.push_back(v);
      return true;
    }
    default:
      return false;
  }
}

// Empty and marked tuples, lists and dicts, and what is appended or set into them.
StatusOr<bool> Reader::containerOpcode(unsigned char op) {
  switch (op) {
    case ')':
      stack_.push_back(value(Kind::kTuple));
      return true;
    case ']':
      stack_.push_back(value(Kind::kList));
      return true;
    case '}':
      stack_.push_back(value(Kind::kDict));
      return true;
    case 0x8f:  // EMPTY_SET: read as a list
      stack_.push_back(value(Kind::kList));
      return true;
    case 't':
    case 'l':
    case 0x91: {  // TUPLE, LIST, FROZENSET
      ASSIGN_OR_RETURN(auto items, popMark());
      auto v = value(op == 't' ? Kind::kTuple : Kind::kList);
      v->items = std::move(items);
      stack_.push_back(v);
      return true;
    }
    case 'd': {  // DICT
      ASSIGN_OR_RETURN(auto items, popMark());
      auto v = value(Kind::kDict);
      RETURN_IF_ERROR(setItems(*v, std::move(items)));
      stack_.push_back(v);
      return true;
    }
    case 0x85:
    case 0x86:
    case 0x87: {  // TUPLE1, TUPLE2, TUPLE3
      const size_t n = op - 0x84;
      auto v = value(Kind::kTuple);
      for (size_t i = 0; i < n; ++i) {
        ASSIGN_OR_RETURN(PickleRef item, pop());
        v->items.insert(v->items.begin(), std::move(item));
      }
      stack_.push_back(v);
      return true;
    }
    case 'a': {  // APPEND
      ASSIGN_OR_RETURN(PickleRef item, pop());
      ASSIGN_OR_RETURN(PickleRef * list, top());
      if ((*list)->kind != Kind::kList) return error("APPEND to a {}", (*list)->kindName());
      (*list)->items.push_back(std::move(item));
      return true;
    }
    case 'e':
    case 0x90: {  // APPENDS, ADDITEMS
      ASSIGN_OR_RETURN(auto items, popMark());
      ASSIGN_OR_RETURN(PickleRef * list, top());
      if ((*list)->kind != Kind::kList) return error("APPENDS to a {}", (*list)->kindName());
      for (auto& item : items) (*list)->items.push_back(std::move(item));
      return true;
    }
    case 's': {  // SETITEM
      ASSIGN_OR_RETURN(PickleRef v, pop());
      ASSIGN_OR_RETURN(PickleRef k, pop());
      ASSIGN_OR_RETURN(PickleRef * dict, top());
      RETURN_IF_ERROR(setItems(**dict, {std::move(k), std::move(v)}));
      return true;
    }
    case 'u': {  // SETITEMS
      ASSIGN_OR_RETURN(auto items, popMark());
      ASSIGN_OR_RETURN(PickleRef * dict, top());
      RETURN_IF_ERROR(setItems(**dict, std::move(items)));
      return true;
    }
    default:
      return false;
  }
}

// Globals (the allowed ones only), REDUCE, NEWOBJ, BUILD and persistent ids: what becomes a
// tensor, a storage or a record.
StatusOr<bool> Reader::objectOpcode(unsigned char op) {
  switch (op) {
    case 'c': {  // GLOBAL
      ASSIGN_OR_RETURN(std::string module, line());
      ASSIGN_OR_RETURN(std::string name, line());
      RETURN_IF_ERROR(pushGlobal(module, name));
      return true;
    }
    case 0x93: {  // STACK_GLOBAL
      ASSIGN_OR_RETURN(PickleRef name, pop());
      ASSIGN_OR_RETURN(PickleRef module, pop());
      if (!name->isString() || !module->isString()) return error("STACK_GLOBAL of values that are not strings");
      RETURN_IF_ERROR(pushGlobal(module->text, name->text));
      return true;
    }
    case 'R': {  // REDUCE
      ASSIGN_OR_RETURN(PickleRef args, pop());
      ASSIGN_OR_RETURN(PickleRef callable, pop());
      RETURN_IF_ERROR(reduce(callable, args));
      return true;
    }
    case 0x81: {  // NEWOBJ: cls.__new__(cls, *args)
      ASSIGN_OR_RETURN(PickleRef args, pop());
      ASSIGN_OR_RETURN(PickleRef cls, pop());
      if (!isGlobal(*cls) || !listed(kRecords, globalName(*cls)))
        return error("NEWOBJ of {}: only DeepSpeed's checkpoint records are made",
                     isGlobal(*cls) ? globalName(*cls) : cls->kindName());
      RETURN_IF_ERROR(reduce(cls, args));
      return true;
    }
    case 'b': {  // BUILD
      ASSIGN_OR_RETURN(PickleRef state, pop());
      ASSIGN_OR_RETURN(PickleRef * target, top());
      RETURN_IF_ERROR(build(*target, state));
      return true;
    }
    case 'Q': {  // BINPERSID
      ASSIGN_OR_RETURN(PickleRef id, pop());
      ASSIGN_OR_RETURN(PickleRef storage, persistent(id));
      stack_.push_back(storage);
      return true;
    }
    default:
      return false;
  }
}

// The memo: PUT and GET.
StatusOr<bool> Reader::memoOpcode(unsigned char op) {
  switch (op) {
    case 'q':
    case 'r':
    case 0x94: {  // BINPUT, LONG_BINPUT, MEMOIZE
      uint64_t index = memo_.size();
      if (op != 0x94) {
        RETURN_IF_ERROR(need(op == 'q' ? 1 : 4));
        index = le(op == 'q' ? 1 : 4);
      }
      ASSIGN_OR_RETURN(PickleRef * t, top());
      if (memo_.size() >= kMaxMemo && !memo_.count(index)) return error("more than {} memo entries", kMaxMemo);
      memo_[index] = *t;
      return true;
    }
    case 'h':
    case 'j': {  // BINGET, LONG_BINGET
      RETURN_IF_ERROR(need(op == 'h' ? 1 : 4));
      const uint64_t index = le(op == 'h' ? 1 : 4);
      auto it = memo_.find(index);
      if (it == memo_.end()) return error("memo entry {} was never stored", index);
      stack_.push_back(it->second);
      return true;
    }
    default:
      return false;
  }
}

StatusOr<PickleRef> Reader::run() {
  while (true) {
    opcodeAt_ = pos_;
    RETURN_IF_ERROR(need(1));
    const auto op = static_cast<unsigned char>(in_[pos_++]);
    if (op == '.') {  // STOP
      ASSIGN_OR_RETURN(PickleRef result, pop());
      if (!stack_.empty() || !marks_.empty()) return error("STOP with {} values left on the stack", stack_.size());
      RETURN_IF_ERROR(checkAcyclic(result));
      return result;
    }
    bool known = false;
    for (auto opcodes : {&Reader::stackOpcode, &Reader::valueOpcode, &Reader::containerOpcode, &Reader::objectOpcode,
                         &Reader::memoOpcode}) {
      ASSIGN_OR_RETURN(known, (this->*opcodes)(op));
      if (known) break;
    }
    if (!known) return error("opcode 0x{:02x} is not one torch.save writes (protocols 2 to 5, no code): refused", op);
  }
}

}  // namespace

int64_t TensorRef::numel() const { return numelOf(shape); }

bool TensorRef::contiguous() const {
  int64_t expected = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    if (shape[i] != 1 && stride[i] != expected) return false;
    expected *= shape[i];
  }
  return true;
}

const PickleValue* PickleValue::get(const std::string& key) const {
  if (kind != Kind::kDict) return nullptr;
  for (size_t k = 0; k + 1 < items.size(); k += 2)
    if (items[k]->isString() && items[k]->text == key) return items[k + 1].get();
  return nullptr;
}

const char* PickleValue::kindName() const {
  switch (kind) {
    case Kind::kNone: return "None";
    case Kind::kBool: return "bool";
    case Kind::kInt: return "int";
    case Kind::kFloat: return "float";
    case Kind::kString: return "str";
    case Kind::kBytes: return "bytes";
    case Kind::kTuple: return "tuple";
    case Kind::kList: return "list";
    case Kind::kDict: return "dict";
    case Kind::kTensor: return "tensor";
    case Kind::kObject: return isGlobal(*this) ? "global" : "object";
  }
  return "?";
}

StatusOr<PickleRef> readTorchPickle(const std::string& bytes, const std::string& source) {
  Reader reader(bytes, source);
  ASSIGN_OR_RETURN(PickleRef result, reader.run());
  return result;
}

const std::vector<std::string>& allowedPickleGlobals() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> out;
    for (const auto& t : kStorageTypes) out.emplace_back(t.name);
    for (const char* n : kDtypes) out.emplace_back(n);
    for (const char* n : kCallables) out.emplace_back(n);
    for (const char* n : kRecords) out.emplace_back(n);
    return out;
  }();
  return names;
}

}  // namespace loom::convert
