#pragma once

#include <cstdint>
#include <cstring>
#include <string>

// Protocol-buffer fields by hand, for the few small and stable messages the monitors write
// (tensorflow.Event, wandb_internal.Record): the build has neither project's protos.
namespace loom::worker::wire {

inline void putVarint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out += static_cast<char>((v & 0x7F) | 0x80);
    v >>= 7;
  }
  out += static_cast<char>(v);
}

template <typename T>
void putLittleEndian(std::string& out, T v) {
  char bytes[sizeof(T)];
  std::memcpy(bytes, &v, sizeof(T));  // x86 and arm64 are little-endian
  out.append(bytes, sizeof(T));
}

// A length-delimited field (a string, bytes or a message), written even when empty.
inline void putBytesField(std::string& out, int field, const std::string& bytes) {
  putVarint(out, static_cast<uint64_t>(field) << 3 | 2);
  putVarint(out, bytes.size());
  out += bytes;
}

// A string field as proto3 writes it: absent when empty.
inline void putStringField(std::string& out, int field, const std::string& text) {
  if (!text.empty()) putBytesField(out, field, text);
}

// A varint field (int32, int64, bool, enum) as proto3 writes it: absent when zero.
inline void putVarintField(std::string& out, int field, int64_t value) {
  if (value == 0) return;
  putVarint(out, static_cast<uint64_t>(field) << 3);
  putVarint(out, static_cast<uint64_t>(value));
}

}  // namespace loom::worker::wire
