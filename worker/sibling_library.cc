#include "worker/sibling_library.h"

#include <cstdlib>

#include <dlfcn.h>

#include "common/files.h"

namespace loom::worker {

StatusOr<void*> loadSiblingEntry(const char* envVar, const std::string& fileName, const char* symbol,
                                 const std::string& what) {
  const char* env = std::getenv(envVar);
  const std::string path = env && *env ? env : files::selfDir() + "/../lib/" + fileName;
  void* handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle) return Status(StatusCode::kFailedPrecondition, "cannot load " + what + ": " + ::dlerror());
  void* entry = ::dlsym(handle, symbol);
  if (!entry) return Status(StatusCode::kFailedPrecondition, path + " has no symbol " + symbol);
  return entry;
}

}  // namespace loom::worker
