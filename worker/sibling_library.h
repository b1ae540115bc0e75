#pragma once

#include <string>

#include "common/status.h"

namespace loom::worker {

// The entry point `symbol` of a library the worker loads only when a job needs it (libtorch's
// side, the Plan reader, the rollout service): at $`envVar` if set, else ../lib/`fileName` beside
// the worker binary; never unloaded. The error names the path and dlopen's reason, or the missing
// symbol.
StatusOr<void*> loadSiblingEntry(const char* envVar, const std::string& fileName, const char* symbol,
                                 const std::string& what);

// What that entry point (a function of no arguments) returns. Callers keep it in a function-local
// static, so that the library is loaded and asked once per process.
template <typename T>
StatusOr<T> callSiblingEntry(const char* envVar, const std::string& fileName, const char* symbol,
                             const std::string& what) {
  ASSIGN_OR_RETURN(void* entry, loadSiblingEntry(envVar, fileName, symbol, what));
  return reinterpret_cast<T (*)()>(entry)();
}

}  // namespace loom::worker
