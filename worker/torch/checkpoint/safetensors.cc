#include "worker/torch/checkpoint/safetensors.h"


#include <algorithm>
#include <cstring>
#include <filesystem>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/files.h"
#include "worker/checkpoint/safetensors_reader.h"
#include "worker/checkpoint/safetensors_writer.h"

namespace loom::worker {

using nlohmann::json;

namespace {

struct DtypeName {
  const char* name;
  at::ScalarType type;
};
constexpr DtypeName kDtypes[] = {
    {"F64", at::kDouble}, {"F32", at::kFloat}, {"F16", at::kHalf}, {"BF16", at::kBFloat16}, {"I64", at::kLong},
    {"I32", at::kInt},    {"I16", at::kShort}, {"I8", at::kChar},  {"U8", at::kByte},       {"BOOL", at::kBool},
};

StatusOr<at::ScalarType> dtypeFromName(const std::string& name) {
  for (const auto& d : kDtypes) {
    if (name == d.name) return d.type;
  }
  return invalidArgument("dtype \"{}\" is not supported", name);
}

StatusOr<const char*> nameFromDtype(at::ScalarType type) {
  for (const auto& d : kDtypes) {
    if (type == d.type) return d.name;
  }
  return invalidArgument("dtype {} cannot be stored in safetensors", c10::toString(type));
}

Status loadFile(const std::string& path, TensorMap* out) {
  ASSIGN_OR_RETURN(auto file, checkpoint::SafetensorsFile::open(path));
  for (const checkpoint::StoredTensor& stored : file->tensors()) {
    ASSIGN_OR_RETURN(at::ScalarType dtype, dtypeFromName(stored.entry.dtype));
    at::Tensor t = at::empty(stored.entry.shape, at::TensorOptions().dtype(dtype));
    RETURN_IF_ERROR(file->read(stored.offset, stored.entry.bytes(), t.data_ptr()));
    (*out)[stored.entry.name] = std::move(t);
  }
  return Status::ok();
}

}  // namespace

StatusOr<TensorMap> loadSafetensors(const std::string& path) {
  TensorMap tensors;
  ASSIGN_OR_RETURN(std::vector<std::string> files, checkpoint::modelFiles(path));
  for (const auto& file : files) RETURN_IF_ERROR(loadFile(file, &tensors));
  return tensors;
}

namespace {

// The torch-free writer's view of the entries, and their bytes from the tensors `produce` hands
// over (checked against their entries: dtype and shape).
StatusOr<std::vector<checkpoint::SafetensorsEntry>> bytesEntries(const std::vector<TensorEntry>& entries) {
  std::vector<checkpoint::SafetensorsEntry> out;
  for (const TensorEntry& e : entries) {
    auto dtype = nameFromDtype(e.dtype);
    if (!dtype.isOk()) return dtype.status().withContext("tensor " + e.name);
    out.push_back({e.name, *dtype, e.shape});
  }
  return out;
}

checkpoint::BytesProducer bytesOf(const std::string& where, const std::vector<TensorEntry>& entries,
                                  const TensorProducer& produce) {
  return [&where, &entries, &produce](size_t i, const checkpoint::ByteSink& sink) -> Status {
    const TensorEntry& e = entries[i];
    ASSIGN_OR_RETURN(at::Tensor produced, produce(i));
    at::Tensor t = produced.detach().to(at::kCPU).contiguous();
    if (t.scalar_type() != e.dtype || t.sizes().vec() != e.shape)
      return internalError("{}: tensor {} came as {} {}, its header says {} {}", where, e.name,
                           c10::toString(t.scalar_type()), c10::str(t.sizes()), c10::toString(e.dtype),
                           c10::str(at::IntArrayRef(e.shape)));
    return sink(t.data_ptr(), static_cast<size_t>(t.numel() * t.element_size()));
  };
}

Status streamSafetensorsFile(const std::string& path, const std::vector<TensorEntry>& entries,
                             const std::vector<size_t>& indices, const TensorProducer& produce,
                             const std::map<std::string, std::string>& metadata) {
  auto bytesEntriesOf = bytesEntries(entries);
  if (!bytesEntriesOf.isOk()) return bytesEntriesOf.status().withContext(path);
  return checkpoint::writeSafetensorsFile(path, *bytesEntriesOf, indices, bytesOf(path, entries, produce), metadata);
}

std::vector<TensorEntry> entriesOf(const TensorMap& tensors) {
  std::vector<TensorEntry> out;
  for (const auto& [name, t] : tensors) out.push_back({name, t.scalar_type(), t.sizes().vec()});
  return out;
}

TensorProducer producerOf(const TensorMap& tensors, const std::vector<TensorEntry>& entries) {
  return [&tensors, &entries](size_t i) -> StatusOr<at::Tensor> { return tensors.at(entries[i].name); };
}

}  // namespace

Status saveSafetensorsFile(const std::string& path, const TensorMap& tensors,
                           const std::map<std::string, std::string>& metadata) {
  const std::vector<TensorEntry> entries = entriesOf(tensors);
  std::vector<size_t> all(entries.size());
  for (size_t i = 0; i < all.size(); ++i) all[i] = i;
  return streamSafetensorsFile(path, entries, all, producerOf(tensors, entries), metadata);
}

StatusOr<std::vector<std::string>> saveSafetensorsModel(const std::string& dir, const TensorMap& tensors,
                                                        int64_t maxShardBytes) {
  const std::vector<TensorEntry> entries = entriesOf(tensors);
  return streamSafetensorsModel(dir, entries, producerOf(tensors, entries), /*write=*/true, maxShardBytes);
}

StatusOr<std::vector<std::string>> streamSafetensorsModel(const std::string& dir, std::vector<TensorEntry> entries,
                                                          const TensorProducer& produce, bool write,
                                                          int64_t maxShardBytes) {
  // Name order, as a safetensors file lists its tensors; `produce` is asked in that order.
  std::vector<size_t> order(entries.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return entries[a].name < entries[b].name; });
  if (!write) {
    for (size_t i : order) RETURN_IF_ERROR(produce(i).status());
    return std::vector<std::string>{};
  }
  // A write that fails part way still asks for the tensors it did not reach: the other ranks
  // gather each of them with this one, and would wait for it in the next gather.
  std::vector<bool> produced(entries.size(), false);
  const TensorProducer tracked = [&](size_t i) {
    produced[i] = true;
    return produce(i);
  };
  StatusOr<std::vector<std::string>> written = [&]() -> StatusOr<std::vector<std::string>> {
    ASSIGN_OR_RETURN(auto bytesEntriesOf, bytesEntries(entries));
    return checkpoint::writeSafetensorsModel(dir, bytesEntriesOf, bytesOf(dir, entries, tracked), maxShardBytes);
  }();
  if (!written.isOk()) {
    for (size_t i : order)
      if (!produced[i]) (void)produce(i);
  }
  return written;
}

}  // namespace loom::worker
