#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "kernels/loom_kernel_abi.h"

namespace loom::kernels {

// The op slots of loom_kernel_table, in table order, for listings and messages.
struct OpSlot {
  const char* name;  // "rms_norm_forward"
  size_t offset;     // offsetof(loom_kernel_table, rms_norm_forward)
};
const std::vector<OpSlot>& opSlots();
const char* opName(size_t offset);

// Whether `table` provides the slot at `offset`: inside the struct it was built with, not NULL.
bool provides(const loom_kernel_table& table, size_t offset);

// The byte offset of a slot given as a member pointer (&loom_kernel_table::adamw_step).
template <typename Fn>
size_t slotOffset(Fn loom_kernel_table::*slot) {
  static const loom_kernel_table probe{};
  return static_cast<size_t>(reinterpret_cast<const char*>(&(probe.*slot)) - reinterpret_cast<const char*>(&probe));
}

// The kernel implementations of this process, and which one runs each op on each device.
//
// Order decides: plugins in the order they were added (the loader adds the job spec's list
// first, then LOOM_KERNEL_PATH), then the reference. A call goes to the first implementation
// that provides the op on the call's device; one that answers LOOM_KERNEL_UNSUPPORTED (a dtype
// or option it does not take) passes the call on to the next, and when none takes it the
// error names each one with its reason. A plugin for another device is never offered a call.
//
// Threading: add*() from one thread before any call; pick(), call() and describe() are
// thread-safe afterwards (the registry does not change).
class KernelRegistry {
 public:
  struct Implementation {
    const loom_kernel_table* table;
    std::string origin;  // the file it came from, or "built in"
    bool reference;
  };

  // A loaded plugin (see kernels/loader.h); `origin` names its file.
  void addPlugin(const loom_kernel_table* table, std::string origin);
  // The built-in libtorch reference (kernels/reference/reference_table.h): offered every op last.
  void addReference(const loom_kernel_table* table);

  // The implementation a call of `slot` on `device` is offered first; nullptr when none has it.
  template <typename Fn>
  const Implementation* pick(Fn loom_kernel_table::*slot, std::string_view device) const {
    auto all = candidates(slotOffset(slot), device);
    return all.empty() ? nullptr : all.front();
  }
  // Whether a plugin (not the reference) provides `slot` on `device`.
  template <typename Fn>
  bool pluginProvides(Fn loom_kernel_table::*slot, std::string_view device) const {
    const Implementation* first = pick(slot, device);
    return first && !first->reference;
  }

  // Runs the op: `registry.call(&loom_kernel_table::adamw_step, "cpu", &config, ...)` with the
  // slot's arguments.
  template <typename Fn, typename... Args>
  Status call(Fn loom_kernel_table::*slot, std::string_view device, Args... args) const {
    const size_t offset = slotOffset(slot);
    std::string refusals;
    for (const Implementation* impl : candidates(offset, device)) {
      const int rc = (impl->table->*slot)(args...);
      if (rc == LOOM_KERNEL_OK) return Status::ok();
      if (rc != LOOM_KERNEL_UNSUPPORTED) return failure(*impl, offset, rc);
      appendRefusal(refusals, *impl);
    }
    return noneTakes(offset, device, refusals);
  }

  const std::vector<Implementation>& plugins() const { return plugins_; }
  // What is loaded and which implementation runs each op, several lines (`loom-worker --version`,
  // the probe job).
  std::string describe() const;

 private:
  std::vector<const Implementation*> candidates(size_t offset, std::string_view device) const;
  static Status failure(const Implementation& impl, size_t offset, int rc);
  static void appendRefusal(std::string& refusals, const Implementation& impl);
  static Status noneTakes(size_t offset, std::string_view device, const std::string& refusals);

  std::vector<Implementation> plugins_;
  std::vector<Implementation> references_;
};

}  // namespace loom::kernels
