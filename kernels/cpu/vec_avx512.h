// 16 fp32 lanes of AVX-512F. Included by isa_avx512.cc inside its target region and namespace;
// includes nothing itself (<immintrin.h> comes first in that file).

struct Vec {
  using Reg = __m512;
  static constexpr int kWidth = 16;

  static Reg zero() { return _mm512_setzero_ps(); }
  static Reg set1(float v) { return _mm512_set1_ps(v); }
  static Reg load(const float* p) { return _mm512_loadu_ps(p); }
  static Reg load(const Bf16* p) {
    const __m256i half = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(half), 16));
  }
  static void store(float* p, Reg v) { _mm512_storeu_ps(p, v); }
  static void store(Bf16* p, Reg v) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(_mm512_srli_epi32(roundedBits(v), 16)));
  }
  // The fp32 value a bf16 rounding of v holds.
  static Reg roundBf16(Reg v) {
    return _mm512_castsi512_ps(_mm512_and_si512(roundedBits(v), _mm512_set1_epi32(static_cast<int>(0xffff0000u))));
  }

  static Reg add(Reg a, Reg b) { return _mm512_add_ps(a, b); }
  static Reg sub(Reg a, Reg b) { return _mm512_sub_ps(a, b); }
  static Reg mul(Reg a, Reg b) { return _mm512_mul_ps(a, b); }
  static Reg div(Reg a, Reg b) { return _mm512_div_ps(a, b); }
  static Reg fmadd(Reg a, Reg b, Reg c) { return _mm512_fmadd_ps(a, b, c); }  // a * b + c
  static Reg sqrt(Reg a) { return _mm512_sqrt_ps(a); }
  static Reg max(Reg a, Reg b) { return _mm512_max_ps(a, b); }
  static Reg neg(Reg a) {
    return _mm512_castsi512_ps(
        _mm512_xor_si512(_mm512_castps_si512(a), _mm512_set1_epi32(static_cast<int>(0x80000000u))));
  }
  // -1, 0 or 1.
  static Reg sign(Reg a) {
    const __mmask16 pos = _mm512_cmp_ps_mask(a, zero(), _CMP_GT_OQ);
    const __mmask16 negative = _mm512_cmp_ps_mask(a, zero(), _CMP_LT_OQ);
    return _mm512_mask_mov_ps(_mm512_maskz_mov_ps(pos, set1(1.0f)), negative, set1(-1.0f));
  }
  static float sum(Reg a) { return _mm512_reduce_add_ps(a); }
  static float maxOf(Reg a) { return _mm512_reduce_max_ps(a); }

  // e^x: Cody-Waite reduction by ln 2, Cephes' degree-5 polynomial, scaling by 2^n with scalef
  // (which also gives 0 below the denormal range and inf above FLT_MAX). About 1 ulp.
  static Reg exp(Reg x) {
    x = _mm512_min_ps(set1(89.0f), x);  // this operand order keeps a NaN
    x = _mm512_max_ps(set1(-104.0f), x);
    const Reg n =
        _mm512_roundscale_ps(mul(x, set1(1.44269504088896341f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    Reg r = _mm512_fnmadd_ps(n, set1(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, set1(-2.12194440e-4f), r);
    Reg p = set1(1.9875691500e-4f);
    p = fmadd(p, r, set1(1.3981999507e-3f));
    p = fmadd(p, r, set1(8.3334519073e-3f));
    p = fmadd(p, r, set1(4.1665795894e-2f));
    p = fmadd(p, r, set1(1.6666665459e-1f));
    p = fmadd(p, r, set1(5.0000001201e-1f));
    p = fmadd(p, mul(r, r), add(r, set1(1.0f)));
    return _mm512_scalef_ps(p, n);
  }

 private:
  // The fp32 bits rounded to nearest even at bit 16; NaN becomes the canonical bf16 NaN.
  static __m512i roundedBits(Reg v) {
    const __m512i bits = _mm512_castps_si512(v);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
    const __m512i rounded = _mm512_add_epi32(bits, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff)));
    const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    return _mm512_mask_mov_epi32(rounded, nan, _mm512_set1_epi32(0x7fc00000));
  }
};
