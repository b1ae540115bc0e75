#include "worker/convert/torch_save_writer.h"

#include <cstring>
#include <filesystem>
#include <map>

namespace loom::convert {

namespace {

struct TorchDtype {
  const char* storage;  // torch.<storage>
  int64_t bytes;
};

const TorchDtype* torchDtype(const std::string& dtype) {
  static const std::map<std::string, TorchDtype> kDtypes{
      {"float32", {"FloatStorage", 4}}, {"float64", {"DoubleStorage", 8}}, {"float16", {"HalfStorage", 2}},
      {"bfloat16", {"BFloat16Storage", 2}}, {"int64", {"LongStorage", 8}}, {"int32", {"IntStorage", 4}},
      {"int16", {"ShortStorage", 2}},     {"int8", {"CharStorage", 1}},     {"uint8", {"ByteStorage", 1}},
      {"bool", {"BoolStorage", 1}}};
  auto it = kDtypes.find(dtype);
  return it == kDtypes.end() ? nullptr : &it->second;
}

}  // namespace

// The opcodes of pickle protocol 2 that torch.save's pickles use.
class PickleBuilder {
 public:
  explicit PickleBuilder(const std::vector<SaveTensor>& tensors) : tensors_(tensors) { out_ += "\x80\x02"; }

  Status value(const SaveValue& v) {
    switch (v.kind_) {
      case SaveValue::Kind::kNone: out_ += 'N'; break;
      case SaveValue::Kind::kBool: out_ += v.integer_ ? '\x88' : '\x89'; break;
      case SaveValue::Kind::kInt: integer(v.integer_); break;
      case SaveValue::Kind::kFloat: real(v.real_); break;
      case SaveValue::Kind::kString: string(v.text_); break;
      case SaveValue::Kind::kList:
        out_ += ']';
        if (!v.items_.empty()) {
          out_ += '(';
          for (const SaveValue& item : v.items_) RETURN_IF_ERROR(value(item));
          out_ += 'e';  // APPENDS
        }
        break;
      case SaveValue::Kind::kTuple:
        out_ += '(';
        for (const SaveValue& item : v.items_) RETURN_IF_ERROR(value(item));
        out_ += 't';
        break;
      case SaveValue::Kind::kDict:
        out_ += '}';
        if (!v.pairs_.empty()) {
          out_ += '(';
          for (const auto& [key, item] : v.pairs_) {
            RETURN_IF_ERROR(value(key));
            RETURN_IF_ERROR(value(item));
          }
          out_ += 'u';  // SETITEMS
        }
        break;
      case SaveValue::Kind::kTensor: return tensor(static_cast<size_t>(v.integer_));
    }
    return Status::ok();
  }

  std::string finish() { return out_ + '.'; }

 private:
  void integer(int64_t v) {
    if (v >= 0 && v < 256) {
      out_ += 'K';
      out_ += static_cast<char>(v);
    } else if (v >= INT32_MIN && v <= INT32_MAX) {
      out_ += 'J';
      le(static_cast<uint32_t>(static_cast<int32_t>(v)), 4);
    } else {
      out_ += '\x8a';  // LONG1: 8 bytes of two's complement, little-endian
      out_ += '\x08';
      le(static_cast<uint64_t>(v), 8);
    }
  }
  void real(double v) {
    uint64_t bits;
    std::memcpy(&bits, &v, 8);
    out_ += 'G';  // BINFLOAT: big-endian
    for (int i = 7; i >= 0; --i) out_ += static_cast<char>(bits >> (8 * i));
  }
  void string(const std::string& s) {
    out_ += 'X';  // BINUNICODE
    le(s.size(), 4);
    out_ += s;
  }
  void global(const char* module, const char* name) {
    out_ += 'c';
    out_ += module;
    out_ += '\n';
    out_ += name;
    out_ += '\n';
  }
  void shape(const std::vector<int64_t>& dims) {
    out_ += '(';
    for (int64_t d : dims) integer(d);
    out_ += 't';
  }
  // _rebuild_tensor_v2(storage, 0, size, stride, False, OrderedDict()), its storage the persistent
  // id ('storage', torch.<Type>Storage, '<index>', 'cpu', numel), as torch.save writes it.
  Status tensor(size_t index) {
    if (index >= tensors_.size()) return internalError("pickle: tensor {} of {}", index, tensors_.size());
    const SaveTensor& t = tensors_[index];
    const TorchDtype* dtype = torchDtype(t.dtype);
    if (!dtype) return invalidArgument("tensor {}: torch.save has no storage for dtype {}", index, t.dtype);
    int64_t numel = 1;
    for (int64_t d : t.shape) numel *= d;
    std::vector<int64_t> stride(t.shape.size());
    int64_t step = 1;
    for (size_t i = t.shape.size(); i-- > 0;) {
      stride[i] = step;
      step *= t.shape[i];
    }
    global("torch._utils", "_rebuild_tensor_v2");
    out_ += '(';
    out_ += '(';
    string("storage");
    global("torch", dtype->storage);
    string(std::to_string(index));
    string("cpu");
    integer(numel);
    out_ += 't';
    out_ += 'Q';  // BINPERSID
    integer(0);
    shape(t.shape);
    shape(stride);
    out_ += '\x89';
    global("collections", "OrderedDict");
    out_ += ')';
    out_ += 'R';
    out_ += 't';
    out_ += 'R';
    return Status::ok();
  }
  void le(uint64_t v, int bytes) {
    for (int i = 0; i < bytes; ++i) out_ += static_cast<char>(v >> (8 * i));
  }

  const std::vector<SaveTensor>& tensors_;
  std::string out_;
};

SaveValue SaveValue::sequence(Kind kind, Items items) {
  SaveValue v;
  v.kind_ = kind;
  v.items_ = std::move(items);
  return v;
}

SaveValue SaveValue::list(Items items) { return sequence(Kind::kList, std::move(items)); }

SaveValue SaveValue::tuple(Items items) { return sequence(Kind::kTuple, std::move(items)); }

SaveValue SaveValue::dict(Pairs pairs) {
  SaveValue v;
  v.kind_ = Kind::kDict;
  v.pairs_ = std::move(pairs);
  return v;
}

SaveValue SaveValue::tensor(size_t index) {
  SaveValue v;
  v.kind_ = Kind::kTensor;
  v.integer_ = static_cast<int64_t>(index);
  return v;
}

void SaveValue::set(const SaveValue& key, SaveValue value) {
  for (auto& [k, v] : pairs_) {
    if (k.kind_ == key.kind_ && k.text_ == key.text_ && k.integer_ == key.integer_) {
      v = std::move(value);
      return;
    }
  }
  pairs_.emplace_back(key, std::move(value));
}

SaveValue SaveValue::fromJson(const nlohmann::json& j) {
  switch (j.type()) {
    case nlohmann::json::value_t::boolean: return SaveValue(j.get<bool>());
    case nlohmann::json::value_t::number_integer:
    case nlohmann::json::value_t::number_unsigned: return SaveValue(j.get<int64_t>());
    case nlohmann::json::value_t::number_float: return SaveValue(j.get<double>());
    case nlohmann::json::value_t::string: return SaveValue(j.get<std::string>());
    case nlohmann::json::value_t::array: {
      Items items;
      for (const auto& item : j) items.push_back(fromJson(item));
      return list(std::move(items));
    }
    case nlohmann::json::value_t::object: {
      Pairs pairs;
      for (const auto& [key, item] : j.items()) pairs.emplace_back(SaveValue(key), fromJson(item));
      return dict(std::move(pairs));
    }
    default: return SaveValue();
  }
}

int64_t SaveTensor::bytes() const {
  const TorchDtype* d = torchDtype(dtype);
  int64_t n = d ? d->bytes : 0;
  for (int64_t s : shape) n *= s;
  return n;
}

std::string torchStorageClass(const std::string& dtype) {
  const TorchDtype* d = torchDtype(dtype);
  return d ? std::string("torch.") + d->storage : std::string();
}

Status writeTorchSave(const std::string& path, const SaveValue& root, const std::vector<SaveTensor>& tensors,
                      const SaveTensorBytes& bytes) {
  PickleBuilder pickle(tensors);
  RETURN_IF_ERROR(pickle.value(root).withContext(path));
  // torch.save names the archive's top folder after the file.
  const std::string stem = std::filesystem::path(path).stem().string();
  ASSIGN_OR_RETURN(ZipWriter zip, ZipWriter::create(path));
  RETURN_IF_ERROR(zip.add(stem + "/data.pkl", pickle.finish()));
  RETURN_IF_ERROR(zip.add(stem + "/byteorder", "little"));
  for (size_t i = 0; i < tensors.size(); ++i) {
    RETURN_IF_ERROR(zip.add(stem + "/data/" + std::to_string(i), tensors[i].bytes(),
                            [&](const ZipWriter::Sink& sink) { return bytes(i, sink); }));
  }
  RETURN_IF_ERROR(zip.add(stem + "/version", "3\n"));
  return zip.finish();
}

}  // namespace loom::convert
