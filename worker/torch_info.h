#pragma once

#include <string>

namespace loom::worker {

// "torch 2.11.0, 8 threads": what the rank's libtorch is (the ready report carries it).
std::string torchInfo();

}  // namespace loom::worker
