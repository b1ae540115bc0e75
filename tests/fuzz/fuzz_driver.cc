#include "tests/fuzz/fuzz_driver.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <vector>

namespace loom::fuzz {

namespace {

void runOne(const std::string& input) {
  LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(input.data()), input.size());
}

bool readInto(const std::filesystem::path& path, std::vector<std::string>& seeds) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  std::stringstream s;
  s << in.rdbuf();
  seeds.push_back(s.str());
  return true;
}

}  // namespace

std::string scratchPath(const std::string& name) {
  const char* dir = std::getenv("TMPDIR");
  return std::string(dir ? dir : "/tmp") + "/loom-fuzz-" + std::to_string(::getpid()) + "-" + name;
}

void writeScratch(const std::string& path, const uint8_t* data, size_t size) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
}

// NAME [--mutations N] [--seed S] FILE_OR_DIRECTORY...
int runDriver(int argc, char** argv, const char* name, const std::string& interesting) {
  int64_t mutations = 2000;
  uint64_t seed = 1;
  std::vector<std::string> seeds;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--mutations" && i + 1 < argc) {
      mutations = std::atoll(argv[++i]);
    } else if (arg == "--seed" && i + 1 < argc) {
      seed = std::strtoull(argv[++i], nullptr, 10);
    } else if (std::filesystem::is_directory(arg)) {
      std::vector<std::filesystem::path> files;
      for (const auto& entry : std::filesystem::directory_iterator(arg))
        if (entry.is_regular_file()) files.push_back(entry.path());
      std::sort(files.begin(), files.end());
      for (const auto& file : files) readInto(file, seeds);
    } else if (!readInto(arg, seeds)) {
      std::fprintf(stderr, "%s: cannot read %s\n", name, arg.c_str());
      return 2;
    }
  }
  if (seeds.empty()) {
    std::fprintf(stderr, "usage: %s [--mutations N] [--seed S] FILE_OR_DIRECTORY...\n", name);
    return 2;
  }
  for (const auto& s : seeds) runOne(s);
  // Each mutation is written here before it runs: after a crash it is the input to keep in the
  // corpus (and to debug), and a clean end removes it.
  const std::string last = (std::getenv("TMPDIR") ? std::string(std::getenv("TMPDIR")) : "/tmp") + "/" + name +
                           ".last-input";
  std::fprintf(stderr, "%s: each mutation is written to %s before it runs\n", name, last.c_str());
  std::mt19937_64 rng(seed);
  for (int64_t m = 0; m < mutations; ++m) {
    std::string s = seeds[rng() % seeds.size()];
    const int edits = 1 + static_cast<int>(rng() % 8);
    for (int e = 0; e < edits; ++e) {
      if (s.empty()) {
        s.push_back(interesting[rng() % interesting.size()]);
        continue;
      }
      const size_t at = rng() % s.size();
      switch (rng() % 5) {
        case 0: s[at] = static_cast<char>(s[at] ^ (1 << (rng() % 8))); break;
        case 1: s.resize(at); break;
        case 2: s.insert(at, 1, interesting[rng() % interesting.size()]); break;
        case 3: s.erase(at, 1 + rng() % 16); break;
        case 4: {
          const std::string& other = seeds[rng() % seeds.size()];
          if (other.empty()) break;
          const size_t from = rng() % other.size();
          s.insert(at, other.substr(from, 1 + rng() % 64));
          break;
        }
      }
    }
    writeScratch(last, reinterpret_cast<const uint8_t*>(s.data()), s.size());
    runOne(s);
  }
  std::filesystem::remove(last);
  std::printf("%s: %zu seeds and %lld mutations read, each to a value or an error\n", name, seeds.size(),
              static_cast<long long>(mutations));
  return 0;
}

}  // namespace loom::fuzz
