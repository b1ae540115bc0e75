// Fuzz harness of the torch.save readers (worker/convert/): the restricted pickle reader and the
// zip archive reader. Built with libFuzzer where the compiler has it (LOOM_FUZZ=ON, clang:
// -fsanitize=fuzzer,address), otherwise as a driver with its own main: it replays the files it
// is given and then runs a fixed number of seeded mutations of them (bit flips, truncations,
// splices, inserted opcodes), which CI runs. Either way every input must end in a value or an
// error: a crash, a hang or a sanitizer report is the bug.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "worker/convert/torch_pickle.h"
#include "worker/convert/zip_archive.h"

namespace {

void readBoth(const std::string& bytes) {
  (void)loom::convert::readTorchPickle(bytes, "fuzz input");
  // The same bytes as an archive, through a file as the reader wants one.
  static const std::string path = [] {
    const char* dir = std::getenv("TMPDIR");
    return std::string(dir ? dir : "/tmp") + "/loom-fuzz-" + std::to_string(::getpid()) + ".zip";
  }();
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }
  auto zip = loom::convert::ZipArchive::open(path);
  if (zip.isOk()) {
    for (const auto& entry : zip->entries()) {
      if (entry.size > (1 << 20)) continue;
      auto member = zip->readAll(entry);
      if (member.isOk()) (void)loom::convert::readTorchPickle(*member, entry.name);
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  readBoth(std::string(reinterpret_cast<const char*>(data), size));
  return 0;
}

#ifndef LOOM_LIBFUZZER
// loom-fuzz-torch-pickle [--mutations N] [--seed S] FILE...
int main(int argc, char** argv) {
  int64_t mutations = 2000;
  uint64_t seed = 1;
  std::vector<std::string> seeds;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--mutations" && i + 1 < argc) {
      mutations = std::atoll(argv[++i]);
    } else if (arg == "--seed" && i + 1 < argc) {
      seed = std::strtoull(argv[++i], nullptr, 10);
    } else {
      std::ifstream in(arg, std::ios::binary);
      if (!in) {
        std::fprintf(stderr, "loom-fuzz-torch-pickle: cannot read %s\n", arg.c_str());
        return 2;
      }
      std::stringstream s;
      s << in.rdbuf();
      seeds.push_back(s.str());
    }
  }
  if (seeds.empty()) {
    std::fprintf(stderr, "usage: loom-fuzz-torch-pickle [--mutations N] [--seed S] FILE...\n");
    return 2;
  }
  for (const auto& s : seeds) readBoth(s);
  std::mt19937_64 rng(seed);
  // Bytes that steer the reader into its branches: opcodes and the structures' signatures.
  const std::string interesting = "\x80\x02()]}qhrjQRb\x81\x93\x8a\x8bXKJMGcNtse\x85\x86\x87PK\x01\x02\x03\x04\x05\x06\xff";
  for (int64_t m = 0; m < mutations; ++m) {
    std::string s = seeds[rng() % seeds.size()];
    const int edits = 1 + static_cast<int>(rng() % 8);
    for (int e = 0; e < edits && !s.empty(); ++e) {
      const size_t at = rng() % s.size();
      switch (rng() % 5) {
        case 0: s[at] = static_cast<char>(s[at] ^ (1 << (rng() % 8))); break;
        case 1: s.resize(at); break;
        case 2: s.insert(at, 1, interesting[rng() % interesting.size()]); break;
        case 3: s.erase(at, 1 + rng() % 16); break;
        case 4: {
          const std::string& other = seeds[rng() % seeds.size()];
          const size_t from = rng() % other.size();
          s.insert(at, other.substr(from, 1 + rng() % 64));
          break;
        }
      }
    }
    readBoth(s);
  }
  std::printf("%zu seeds and %lld mutations read, each to a value or an error\n", seeds.size(),
              static_cast<long long>(mutations));
  return 0;
}
#endif
