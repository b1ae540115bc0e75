// The loader and the registry: plugin paths, the ABI check, which implementation each op goes to,
// fallback past an implementation that refuses a call, and what describe() shows.
#include <ATen/ATen.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "kernels/loader.h"
#include "kernels/reference/reference_table.h"
#include "kernels/registry.h"
#include "tests/catch.h"
#include "tests/conformance/kernel_conformance.h"
#include "tests/temp_dir.h"

using namespace loom;
using loom::kernels::KernelRegistry;

namespace {

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

void touch(const std::string& path) { std::ofstream(path) << "x"; }

}  // namespace

TEST_CASE("a plugin built for another ABI version is refused with a message naming it", "[kernels]") {
  auto opened = kernels::openPlugin(LOOM_BAD_ABI_PLUGIN_PATH, nullptr);
  REQUIRE_FALSE(opened.isOk());
  const std::string message = opened.status().message();
  INFO(message);
  CHECK(opened.status().code() == StatusCode::kFailedPrecondition);
  CHECK(contains(message, LOOM_BAD_ABI_PLUGIN_PATH));
  CHECK(contains(message, "ABI version 999"));
  CHECK(contains(message, "expects version " + std::to_string(LOOM_KERNEL_ABI_VERSION)));

  // Through loadPlugins the same refusal stops the load.
  KernelRegistry registry;
  Status loaded = kernels::loadPlugins(registry, {LOOM_BAD_ABI_PLUGIN_PATH}, nullptr);
  CHECK(contains(loaded.message(), "ABI version 999"));
  CHECK(registry.plugins().empty());
}

TEST_CASE("a library without the entry symbol, or a missing file, is refused by name", "[kernels]") {
  auto noSymbol = kernels::openPlugin(LOOM_NO_SYMBOL_PLUGIN_PATH, nullptr);
  REQUIRE_FALSE(noSymbol.isOk());
  CHECK(contains(noSymbol.status().message(), LOOM_NO_SYMBOL_PLUGIN_PATH));
  CHECK(contains(noSymbol.status().message(), "no symbol loom_kernel_plugin"));

  testing::TempDir dir;
  auto missing = kernels::openPlugin(dir.path() + "/libloom_kernels_none.so", nullptr);
  REQUIRE_FALSE(missing.isOk());
  CHECK(contains(missing.status().message(), dir.path() + "/libloom_kernels_none.so"));
}

TEST_CASE("plugin paths: the job's list, then LOOM_KERNEL_PATH, directories by name, each file once", "[kernels]") {
  testing::TempDir dir;
  const std::string a = dir.path() + "/a", b = dir.path() + "/b";
  std::filesystem::create_directories(a);
  std::filesystem::create_directories(b);
  touch(a + "/libloom_kernels_z.so");
  touch(a + "/libloom_kernels_y.so");
  touch(a + "/libother.so");
  touch(b + "/libloom_kernels_x.so");
  const std::string explicitFile = b + "/custom.so";
  touch(explicitFile);

  const std::string env = b + "::" + a + ":" + a + "/libloom_kernels_y.so";
  auto files = kernels::pluginFiles({explicitFile, a + "/libloom_kernels_z.so"}, env.c_str());
  REQUIRE(files.isOk());
  CHECK(*files == std::vector<std::string>{explicitFile, a + "/libloom_kernels_z.so", b + "/libloom_kernels_x.so",
                                           a + "/libloom_kernels_y.so"});

  auto missing = kernels::pluginFiles({}, (a + ":" + dir.path() + "/nope").c_str());
  REQUIRE_FALSE(missing.isOk());
  CHECK(missing.status().code() == StatusCode::kNotFound);
  CHECK(contains(missing.status().message(), dir.path() + "/nope"));
  CHECK(contains(missing.status().message(), "LOOM_KERNEL_PATH"));

  auto none = kernels::pluginFiles({}, nullptr);
  REQUIRE(none.isOk());
  CHECK(none->empty());
}

TEST_CASE("the registry offers each op to the plugin first, then the reference", "[kernels]") {
  KernelRegistry registry;
  REQUIRE(kernels::loadPlugins(registry, {LOOM_CPU_PLUGIN_PATH}, nullptr).isOk());
  registry.addReference(kernels::reference::referenceKernelTable());

  const auto* adam = registry.pick(&loom_kernel_table::adamw_step, "cpu");
  REQUIRE(adam);
  CHECK(std::string(adam->table->name) == "loom-cpu");
  CHECK(adam->origin == LOOM_CPU_PLUGIN_PATH);
  CHECK(registry.pluginProvides(&loom_kernel_table::rms_norm_forward, "cpu"));
  CHECK_FALSE(registry.pluginProvides(&loom_kernel_table::rms_norm_forward, "cuda"));
  CHECK(registry.pick(&loom_kernel_table::rms_norm_forward, "cuda") == nullptr);

  // A call runs; one with no implementation on the device says so.
  at::Tensor x = at::randn({4, 8}), w = at::ones({8}), y = at::empty({4, 8});
  Status ran = registry.call(&loom_kernel_table::rms_norm_forward, "cpu", LOOM_DTYPE_F32, x.data_ptr(), w.data_ptr(),
                             y.data_ptr(), nullptr, 4, 8, 1e-6, nullptr);
  CHECK(ran.isOk());
  Status cuda = registry.call(&loom_kernel_table::rms_norm_forward, "cuda", LOOM_DTYPE_F32, x.data_ptr(), w.data_ptr(),
                              y.data_ptr(), nullptr, 4, 8, 1e-6, nullptr);
  CHECK(cuda.code() == StatusCode::kUnimplemented);
  CHECK(contains(cuda.message(), "rms_norm_forward"));

  // amsgrad: every implementation refuses, and the error names each with its reason.
  loom_adam_config config{.lr = 1e-3, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .step = 1, .amsgrad = 1};
  at::Tensor p = at::ones({8}), g = at::ones({8}), m = at::zeros({8}), v = at::zeros({8});
  Status refused = registry.call(&loom_kernel_table::adamw_step, "cpu", &config, LOOM_DTYPE_F32, p.data_ptr(),
                                 LOOM_DTYPE_F32, g.data_ptr(), m.data_ptr<float>(), v.data_ptr<float>(), 8, nullptr);
  INFO(refused.message());
  CHECK(refused.code() == StatusCode::kUnimplemented);
  CHECK(contains(refused.message(), "adamw_step"));
  CHECK(contains(refused.message(), "loom-cpu: adamw_step: amsgrad is not supported"));
  CHECK(contains(refused.message(), "reference: amsgrad is not supported"));
  CHECK(p.equal(at::ones({8})));

  const std::string described = registry.describe();
  INFO(described);
  CHECK(contains(described, "kernel ABI 1"));
  CHECK(contains(described, "loom-cpu [cpu, "));
  CHECK(contains(described, LOOM_CPU_PLUGIN_PATH));
  CHECK(contains(described, "reference [cpu, libtorch]: 18 ops, built in"));
  CHECK(contains(described, "cpu ops: loom-cpu (all)"));
}

namespace {

// A plugin table of an older, shorter layout: only the slots up to rms_norm_forward exist.
int fakeRmsNorm(loom_dtype, const void*, const void*, void*, float*, int64_t, int64_t, double, void*) {
  return LOOM_KERNEL_UNSUPPORTED;
}
const char* fakeError() { return "fp32 only"; }

}  // namespace

TEST_CASE("slots past a plugin's struct_size are absent, and a refusal passes the call on", "[kernels]") {
  loom_kernel_table shortTable{};
  shortTable.abi_version = LOOM_KERNEL_ABI_VERSION;
  shortTable.struct_size = offsetof(loom_kernel_table, rms_norm_backward);
  shortTable.name = "short";
  shortTable.device = "cpu";
  shortTable.isa = "test";
  shortTable.last_error = fakeError;
  shortTable.rms_norm_forward = fakeRmsNorm;
  shortTable.adamw_step = testing::cpuPlugin().adamw_step;  // past struct_size: must not count

  KernelRegistry registry;
  registry.addPlugin(&shortTable, "test table");
  registry.addReference(kernels::reference::referenceKernelTable());
  CHECK(std::string(registry.pick(&loom_kernel_table::rms_norm_forward, "cpu")->table->name) == "short");
  CHECK(std::string(registry.pick(&loom_kernel_table::adamw_step, "cpu")->table->name) == "reference");

  // The short table refuses (UNSUPPORTED): the reference takes the call.
  at::Tensor x = at::randn({2, 4}), w = at::ones({4}), y = at::zeros({2, 4});
  Status ran = registry.call(&loom_kernel_table::rms_norm_forward, "cpu", LOOM_DTYPE_F32, x.data_ptr(), w.data_ptr(),
                             y.data_ptr(), nullptr, 2, 4, 1e-6, nullptr);
  CHECK(ran.isOk());
  CHECK(y.abs().sum().item<float>() > 0.0f);
  CHECK(contains(registry.describe(), "cpu ops: reference ("));
}

TEST_CASE("a plugin whose init fails is refused with its reason", "[kernels]") {
  ::setenv("LOOM_KERNEL_CPU_ISA", "avx3", 1);
  auto opened = kernels::openPlugin(LOOM_CPU_PLUGIN_PATH, nullptr);
  ::unsetenv("LOOM_KERNEL_CPU_ISA");
  REQUIRE_FALSE(opened.isOk());
  INFO(opened.status().message());
  CHECK(contains(opened.status().message(), "init failed"));
  CHECK(contains(opened.status().message(), "unknown instruction set 'avx3'"));
  // The failed init changed nothing: the plugin still runs.
  testing::configurePlugin(testing::pluginSetups().front());
  at::Tensor g = at::randn({64}), u = at::randn({64}), out = at::empty({64});
  CHECK(testing::cpuPlugin().swiglu_forward(LOOM_DTYPE_F32, g.data_ptr(), u.data_ptr(), out.data_ptr(), 64, nullptr) ==
        LOOM_KERNEL_OK);
}

TEST_CASE("a job's plugin names are found in the kernel directories only, never as paths", "[kernels]") {
  testing::TempDir dir;
  const std::string a = dir.path() + "/a", b = dir.path() + "/b";
  std::filesystem::create_directories(a);
  std::filesystem::create_directories(b);
  touch(b + "/libloom_kernels_fast.so");
  touch(a + "/libloom_kernels_cpu.so");
  touch(b + "/libloom_kernels_cpu.so");
  CHECK(kernels::findPlugin("fast", {a, b}).value() == b + "/libloom_kernels_fast.so");
  CHECK(kernels::findPlugin("libloom_kernels_fast.so", {a, b}).value() == b + "/libloom_kernels_fast.so");
  CHECK(kernels::findPlugin("cpu", {a, b}).value() == a + "/libloom_kernels_cpu.so");  // the first directory's

  for (const std::string& path : {b + "/libloom_kernels_fast.so", std::string("../b/libloom_kernels_fast.so"),
                                  std::string("libloom_kernels_.so"), std::string("Fast"), std::string("")}) {
    auto refused = kernels::findPlugin(path, {a, b});
    INFO(path);
    REQUIRE_FALSE(refused.isOk());
    CHECK(refused.status().code() == StatusCode::kInvalidArgument);
    CHECK(contains(refused.status().message(), "is not a plugin name"));
  }
  auto absent = kernels::findPlugin("cuda", {a, b});
  REQUIRE_FALSE(absent.isOk());
  CHECK(absent.status().code() == StatusCode::kNotFound);
  CHECK(contains(absent.status().message(), "in none of this node's kernel directories (" + a + ", " + b));
}
