#pragma once

#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace loom::planner {

// Every key of DeepSpeed 0.19.8's config (its top level and the sections Loom reads key by key:
// zero_optimization and its offload blocks, fp16, bf16, activation_checkpointing), and what Loom
// does with it. docs/training.md's table lists the same (a unit test holds them together).
enum class KeyUse {
  kHonoured,     // acts as in DeepSpeed (the config parser reads it)
  kNoEffect,     // read and kept in the normalized spec; the reason says why it changes nothing
  kIgnored,      // accepted at any value and left out of the normalized spec; the reason says why
  kDefaultOnly,  // accepted at DeepSpeed's default (or disabled); another value is refused with the reason
  kRemoved,      // refused with the reason: DeepSpeed 0.19.8 removed it and refuses it too
};

struct DeepSpeedKey {
  std::string_view path;    // "wall_clock_breakdown", "zero_optimization.offload_param"
  KeyUse use;
  std::string_view inert;   // kDefaultOnly: DeepSpeed's default, as JSON
  std::string_view reason;  // what the key does (or not) in Loom
};

const std::vector<DeepSpeedKey>& deepSpeedKeys();
const char* keyUseName(KeyUse use);  // "honoured", "no effect", "ignored", "default only", "removed"

// A DeepSpeed config checked key by key against the catalogue: `config` is what the parser reads
// — without the keys that change nothing (kIgnored, kDefaultOnly ones at their default), and
// without "auto" in DeepSpeed's own sections (zero_optimization, its offload blocks, fp16, bf16:
// DeepSpeed takes the default for it; their `enabled` is resolveAutoValues' to decide).
// `refusals` names each refused key — removed, not at its default, not a DeepSpeed key at all —
// with its reason.
struct ScreenedConfig {
  nlohmann::json config;
  std::vector<std::string> refusals;
};
ScreenedConfig screenDeepSpeedKeys(const nlohmann::json& deepspeed);


}  // namespace loom::planner
