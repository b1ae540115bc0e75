// One fp32 lane: the portable path, for processors without AVX2. Included by isa_scalar.cc inside
// its namespace; includes nothing itself (<cmath> comes first in that file).

struct Vec {
  using Reg = float;
  static constexpr int kWidth = 1;

  static Reg zero() { return 0.0f; }
  static Reg set1(float v) { return v; }
  static Reg load(const float* p) { return *p; }
  static Reg load(const Bf16* p) { return toFloat(*p); }
  static void store(float* p, Reg v) { *p = v; }
  static void store(Bf16* p, Reg v) { *p = toBf16(v); }
  static Reg roundBf16(Reg v) { return toFloat(toBf16(v)); }

  static Reg add(Reg a, Reg b) { return a + b; }
  static Reg sub(Reg a, Reg b) { return a - b; }
  static Reg mul(Reg a, Reg b) { return a * b; }
  static Reg div(Reg a, Reg b) { return a / b; }
  static Reg fmadd(Reg a, Reg b, Reg c) { return std::fma(a, b, c); }
  static Reg sqrt(Reg a) { return std::sqrt(a); }
  static Reg max(Reg a, Reg b) { return a > b ? a : b; }
  static Reg neg(Reg a) { return -a; }
  static Reg sign(Reg a) { return a > 0.0f ? 1.0f : (a < 0.0f ? -1.0f : 0.0f); }
  static float sum(Reg a) { return a; }
  static float maxOf(Reg a) { return a; }
  static Reg exp(Reg x) { return std::exp(x); }
};
