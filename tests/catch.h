#pragma once

// Catch2 v2 (Debian 12) and v3 (the GPU machine) behind one include.
#if __has_include(<catch2/catch_all.hpp>)
#include <catch2/catch_all.hpp>
using Catch::Approx;  // global in v2
#else
#include <catch2/catch.hpp>
#endif
