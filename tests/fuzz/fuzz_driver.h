#pragma once

// The fuzz harnesses' two builds (tests/fuzz/README.md). Each harness defines
// LLVMFuzzerTestOneInput: every input must end in a value or an error, never a crash, a hang or
// a sanitizer report. With LOOM_FUZZ=ON (clang) it is a libFuzzer binary for long runs; otherwise
// runDriver is its main: it reads the files and directories it is given (the corpus), then runs
// a fixed number of seeded mutations of them (bit flips, truncations, inserted bytes, splices),
// which CI runs.
#include <cstddef>
#include <cstdint>
#include <string>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace loom::fuzz {

// `name` for messages; `interesting`: bytes that steer the parser into its branches.
int runDriver(int argc, char** argv, const char* name, const std::string& interesting);

// A path of this process's own for a harness whose parser reads a file ("name" in TMPDIR).
std::string scratchPath(const std::string& name);
void writeScratch(const std::string& path, const uint8_t* data, size_t size);

}  // namespace loom::fuzz

#ifdef LOOM_LIBFUZZER
#define LOOM_FUZZ_MAIN(name, interesting)
#else
#define LOOM_FUZZ_MAIN(name, interesting) \
  int main(int argc, char** argv) { return loom::fuzz::runDriver(argc, argv, name, interesting); }
#endif
