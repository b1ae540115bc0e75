#pragma once

#include <cstdint>
#include <string>

namespace loom::convert {

// A dtype as torch.save names it ("float32") and as safetensors does ("F32").
struct StoredDtype {
  const char* stored;
  const char* safetensors;
  bool floating;
};
// null for a dtype safetensors does not hold.
const StoredDtype* storedDtype(const std::string& stored);
// The same by safetensors' name ("F32"); null for one it does not have.
const StoredDtype* storedDtypeOfSafetensors(const std::string& safetensors);

// The safetensors dtype a tensor is written in for convert.dtype (keep, fp32, bf16): floating
// tensors in fp32 or bf16, or as stored; the others always as stored.
std::string outputDtype(const StoredDtype& stored, const std::string& dtype);

// `count` elements of floating dtype `from` (F32, F64, F16, BF16) at `in` written as `to` (F32 or
// BF16) at `out`, rounded as torch rounds them: to nearest, ties to even; a NaN in bf16 is 0x7fc0.
void castFloats(const std::string& from, const std::string& to, const char* in, char* out, int64_t count);

}  // namespace loom::convert
