# libtorch from the torch wheel. The wheel's own CMake config wants the CUDA toolkit it was
# built with; a build that only needs the CPU libraries links torch_cpu and c10 through this
# imported target instead, so the same tree builds on machines with and without a GPU.
#
# LOOM_PYTHON is the interpreter whose torch is linked, and which runs the oracles and benchmarks:
# the environment scripts/setup fills (LOOM_VENV where that names one, else the repository's
# .venv), else python3 on PATH (the GPU machine's venv); -DLOOM_PYTHON=... names another.
if(NOT LOOM_PYTHON)
  if(DEFINED ENV{LOOM_VENV} AND EXISTS "$ENV{LOOM_VENV}/bin/python3")
    set(LOOM_PYTHON "$ENV{LOOM_VENV}/bin/python3")
  elseif(EXISTS "${CMAKE_SOURCE_DIR}/.venv/bin/python3")
    set(LOOM_PYTHON "${CMAKE_SOURCE_DIR}/.venv/bin/python3")
  else()
    find_program(LOOM_PYTHON_ON_PATH python3 REQUIRED)
    set(LOOM_PYTHON "${LOOM_PYTHON_ON_PATH}")
  endif()
endif()
execute_process(
  COMMAND ${LOOM_PYTHON} -c "import os, torch; print(os.path.dirname(torch.__file__))"
  OUTPUT_VARIABLE LOOM_TORCH_DIR OUTPUT_STRIP_TRAILING_WHITESPACE
  RESULT_VARIABLE torch_found)
if(NOT torch_found EQUAL 0 OR NOT EXISTS "${LOOM_TORCH_DIR}/lib/libtorch_cpu.so")
  message(FATAL_ERROR "torch (the wheel) is not importable by ${LOOM_PYTHON}: run scripts/setup")
endif()

add_library(loom_torch_libs INTERFACE)
target_include_directories(loom_torch_libs SYSTEM INTERFACE
  ${LOOM_TORCH_DIR}/include
  ${LOOM_TORCH_DIR}/include/torch/csrc/api/include)
# The wheel ships fmt headers (v12) that shadow Debian's fmt 9 on this include path: torch-facing
# code uses them header-only, so no fmt library of either version needs to match.
target_compile_definitions(loom_torch_libs INTERFACE _GLIBCXX_USE_CXX11_ABI=1 FMT_HEADER_ONLY)
target_link_libraries(loom_torch_libs INTERFACE
  ${LOOM_TORCH_DIR}/lib/libtorch_cpu.so
  ${LOOM_TORCH_DIR}/lib/libc10.so)
target_link_options(loom_torch_libs INTERFACE "-Wl,-rpath,${LOOM_TORCH_DIR}/lib")
message(STATUS "libtorch: ${LOOM_TORCH_DIR} (from ${LOOM_PYTHON})")
