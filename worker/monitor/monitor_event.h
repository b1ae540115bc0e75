#pragma once

#include <cstdint>
#include <string>

namespace loom::worker {

// One scalar, as DeepSpeed's write_events takes it: its x is the samples trained so far.
struct MonitorEvent {
  std::string tag;  // "Train/Samples/lr"
  double value;
  int64_t samples;
};

// A double as Python's repr() writes it ("0.001", "65536.0", "1e-05"): what DeepSpeed's CSV has,
// and what json.dumps writes for a finite float.
std::string pythonFloat(double value);

}  // namespace loom::worker
