#include "kernels/registry.h"

#include <fmt/ranges.h>

#include <cstring>
#include <map>

namespace loom::kernels {

#define LOOM_OP_SLOT(name) \
  OpSlot { #name, offsetof(loom_kernel_table, name) }

const std::vector<OpSlot>& opSlots() {
  static const std::vector<OpSlot> slots{
      LOOM_OP_SLOT(rms_norm_forward),
      LOOM_OP_SLOT(rms_norm_backward),
      LOOM_OP_SLOT(rope_forward),
      LOOM_OP_SLOT(rope_backward),
      LOOM_OP_SLOT(swiglu_forward),
      LOOM_OP_SLOT(swiglu_backward),
      LOOM_OP_SLOT(cross_entropy_forward),
      LOOM_OP_SLOT(cross_entropy_backward),
      LOOM_OP_SLOT(logprobs),
      LOOM_OP_SLOT(entropy),
      LOOM_OP_SLOT(kl_divergence),
      LOOM_OP_SLOT(adamw_step),
      LOOM_OP_SLOT(lion_step),
      LOOM_OP_SLOT(adagrad_step),
      LOOM_OP_SLOT(masked_softmax_forward),
      LOOM_OP_SLOT(masked_softmax_backward),
      LOOM_OP_SLOT(clamped_swiglu_forward),
      LOOM_OP_SLOT(clamped_swiglu_backward),
      LOOM_OP_SLOT(paged_attention_decode),
      LOOM_OP_SLOT(rope_kv_write),
      LOOM_OP_SLOT(add_rms_norm),
      LOOM_OP_SLOT(greedy_logprobs),
  };
  return slots;
}

#undef LOOM_OP_SLOT

const char* opName(size_t offset) {
  for (const OpSlot& slot : opSlots())
    if (slot.offset == offset) return slot.name;
  return "?";
}

bool provides(const loom_kernel_table& table, size_t offset) {
  if (offset + sizeof(void*) > table.struct_size) return false;
  void* fn = nullptr;
  std::memcpy(&fn, reinterpret_cast<const char*>(&table) + offset, sizeof(fn));
  return fn != nullptr;
}

void KernelRegistry::addPlugin(const loom_kernel_table* table, std::string origin) {
  plugins_.push_back({.table = table, .origin = std::move(origin), .reference = false});
}

void KernelRegistry::addReference(const loom_kernel_table* table) {
  references_.push_back({.table = table, .origin = "built in", .reference = true});
}

std::vector<const KernelRegistry::Implementation*> KernelRegistry::candidates(size_t offset,
                                                                              std::string_view device) const {
  std::vector<const Implementation*> out;
  for (const auto* list : {&plugins_, &references_})
    for (const Implementation& impl : *list)
      if (device == impl.table->device && provides(*impl.table, offset)) out.push_back(&impl);
  return out;
}

namespace {

std::string reasonOf(const loom_kernel_table& table) {
  const char* why = provides(table, offsetof(loom_kernel_table, last_error)) ? table.last_error() : nullptr;
  return why && *why ? why : "no reason given";
}

}  // namespace

Status KernelRegistry::failure(const Implementation& impl, size_t offset, int rc) {
  const StatusCode code = rc == LOOM_KERNEL_INVALID_ARGUMENT ? StatusCode::kInvalidArgument : StatusCode::kInternal;
  return {code, fmt::format("kernel {} of {} ({}) failed (status {}): {}", opName(offset), impl.table->name,
                            impl.origin, rc, reasonOf(*impl.table))};
}

void KernelRegistry::appendRefusal(std::string& refusals, const Implementation& impl) {
  refusals += fmt::format("{}{}: {}", refusals.empty() ? "" : "; ", impl.table->name, reasonOf(*impl.table));
}

Status KernelRegistry::noneTakes(size_t offset, std::string_view device, const std::string& refusals) {
  if (refusals.empty())
    return {StatusCode::kUnimplemented,
            fmt::format("kernel {}: no implementation is loaded for device {}", opName(offset), device)};
  return {StatusCode::kUnimplemented,
          fmt::format("kernel {} on {}: no implementation takes this call ({})", opName(offset), device, refusals)};
}

std::string KernelRegistry::describe() const {
  std::string out = fmt::format("kernel ABI {}", LOOM_KERNEL_ABI_VERSION);
  std::map<std::string, int> devices;
  for (const auto* list : {&plugins_, &references_}) {
    for (const Implementation& impl : *list) {
      int ops = 0;
      for (const OpSlot& slot : opSlots()) ops += provides(*impl.table, slot.offset) ? 1 : 0;
      out += fmt::format("\n  {} [{}, {}]: {} ops, {}", impl.table->name, impl.table->device,
                         impl.table->isa ? impl.table->isa : "?", ops, impl.origin);
      devices[impl.table->device] = 0;
    }
  }
  if (devices.empty()) out += "\n  (no implementations loaded)";
  for (const auto& [device, unused] : devices) {
    // One line per device: which implementation each op goes to first.
    std::map<std::string, std::vector<std::string>> byImpl;
    std::vector<std::string> missing;
    for (const OpSlot& slot : opSlots()) {
      auto all = candidates(slot.offset, device);
      if (all.empty()) {
        missing.push_back(slot.name);
      } else {
        byImpl[all.front()->table->name].push_back(slot.name);
      }
    }
    out += fmt::format("\n  {} ops:", device);
    for (const auto& [name, ops] : byImpl)
      out += fmt::format(" {} ({})", name,
                         ops.size() == opSlots().size() ? "all" : fmt::format("{}", fmt::join(ops, ", ")));
    if (!missing.empty()) out += fmt::format("; none for {}", fmt::join(missing, ", "));
  }
  return out;
}

}  // namespace loom::kernels
