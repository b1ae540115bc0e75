#include "worker/convert/dtype_cast.h"

#include <cmath>
#include <cstring>

namespace loom::convert {

namespace {

constexpr StoredDtype kDtypes[] = {
    {"float32", "F32", true}, {"bfloat16", "BF16", true}, {"float16", "F16", true}, {"float64", "F64", true},
    {"int64", "I64", false},  {"int32", "I32", false},    {"int16", "I16", false},  {"int8", "I8", false},
    {"uint8", "U8", false},   {"bool", "BOOL", false},
};

float fromF32(const char* p) {
  float f;
  std::memcpy(&f, p, 4);
  return f;
}

float fromF64(const char* p) {
  double d;
  std::memcpy(&d, p, 8);
  return static_cast<float>(d);  // round to nearest even, as a C++ (and torch) cast
}

float fromBF16(const char* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

float fromF16(const char* p) {
  // IEEE half: sign, 5 exponent bits, 10 mantissa bits.
  uint16_t h;
  std::memcpy(&h, p, 2);
  const uint32_t sign = (h >> 15) & 1, exponent = (h >> 10) & 0x1f, mantissa = h & 0x3ff;
  float magnitude;
  if (exponent == 0) {
    magnitude = std::ldexp(static_cast<float>(mantissa), -24);
  } else if (exponent == 31) {
    magnitude = mantissa ? NAN : INFINITY;
  } else {
    magnitude = std::ldexp(static_cast<float>(mantissa | 0x400), static_cast<int>(exponent) - 25);
  }
  return sign ? -magnitude : magnitude;
}

uint16_t toBF16(float f) {
  if (std::isnan(f)) return 0x7fc0;
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  bits += 0x7fff + ((bits >> 16) & 1);
  return static_cast<uint16_t>(bits >> 16);
}

}  // namespace

const StoredDtype* storedDtype(const std::string& stored) {
  for (const auto& d : kDtypes)
    if (stored == d.stored) return &d;
  return nullptr;
}

const StoredDtype* storedDtypeOfSafetensors(const std::string& safetensors) {
  for (const auto& d : kDtypes)
    if (safetensors == d.safetensors) return &d;
  return nullptr;
}

std::string outputDtype(const StoredDtype& stored, const std::string& dtype) {
  if (!stored.floating || dtype == "keep") return stored.safetensors;
  return dtype == "bf16" ? "BF16" : "F32";
}

void castFloats(const std::string& from, const std::string& to, const char* in, char* out, int64_t count) {
  // The dtypes are chosen once per call, not per element.
  float (*read)(const char*) = from == "F32" ? fromF32 : from == "F64" ? fromF64 : from == "BF16" ? fromBF16 : fromF16;
  const int64_t inBytes = from == "F64" ? 8 : from == "F32" ? 4 : 2;
  if (to == "F32") {
    for (int64_t i = 0; i < count; ++i) {
      const float f = read(in + i * inBytes);
      std::memcpy(out + i * 4, &f, 4);
    }
    return;
  }
  for (int64_t i = 0; i < count; ++i) {
    const uint16_t b = toBF16(read(in + i * inBytes));
    std::memcpy(out + i * 2, &b, 2);
  }
}

}  // namespace loom::convert
