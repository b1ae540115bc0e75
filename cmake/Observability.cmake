# cpp-httplib and prometheus-cpp's core, as the imported targets loom::httplib and loom::prometheus.
# Found by path rather than through their package configs: prometheus-cpp's config also demands
# civetweb and curl (its pull and push parts, unused here), and pkg-config may be absent on the
# GPU machine, where both come from extracted Debian packages (scripts/gpu/fetch-debs).
find_path(LOOM_HTTPLIB_INCLUDE_DIR httplib.h REQUIRED)
find_library(LOOM_HTTPLIB_LIBRARY cpp-httplib REQUIRED)
find_package(OpenSSL REQUIRED)
add_library(loom::httplib UNKNOWN IMPORTED)
set_target_properties(loom::httplib PROPERTIES
  IMPORTED_LOCATION "${LOOM_HTTPLIB_LIBRARY}"
  INTERFACE_INCLUDE_DIRECTORIES "${LOOM_HTTPLIB_INCLUDE_DIR}"
  # Debian builds libcpp-httplib with these (its cpp-httplib.pc): the classes' layout depends on them.
  INTERFACE_COMPILE_DEFINITIONS "CPPHTTPLIB_OPENSSL_SUPPORT;CPPHTTPLIB_ZLIB_SUPPORT;CPPHTTPLIB_BROTLI_SUPPORT"
  INTERFACE_LINK_LIBRARIES "OpenSSL::SSL;ZLIB::ZLIB")

find_path(LOOM_PROMETHEUS_INCLUDE_DIR prometheus/registry.h REQUIRED)
find_library(LOOM_PROMETHEUS_LIBRARY prometheus-cpp-core REQUIRED)
add_library(loom::prometheus UNKNOWN IMPORTED)
set_target_properties(loom::prometheus PROPERTIES
  IMPORTED_LOCATION "${LOOM_PROMETHEUS_LIBRARY}"
  INTERFACE_INCLUDE_DIRECTORIES "${LOOM_PROMETHEUS_INCLUDE_DIR}")
